package mean

import "testing"

func TestMean(t *testing.T) {
	cases := []struct {
		xs   []int
		want int
	}{
		{[]int{1, 2, 3}, 2},
		{[]int{1, 2}, 2},
		{nil, 0},
	}
	for _, c := range cases {
		if got := Mean(c.xs); got != c.want {
			t.Errorf("Mean(%v) = %d, want %d", c.xs, got, c.want)
		}
	}
}
