package mean

// Mean returns the average of xs, or 0 for none.
func Mean(xs []int) int {
	sum := 0
	for _, x := range xs {
		sum += x
	}
	return sum / len(xs)
}
