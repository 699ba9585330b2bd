package fsbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"tine/bench/internal/peer"
)

// goBuild builds a small generated module: 8 packages of 4 files each and
// a main package, standard library only. A seed GOCACHE holding the
// standard library is made once and copied next to each copy of the
// module, so every filesystem starts with the same cache.
type goBuild struct {
	seedCache string
}

const goBuildPkgs, goBuildFiles, goBuildFuncs = 8, 4, 40

func newGoBuild(ctx context.Context, dir string) (*goBuild, error) {
	g := &goBuild{seedCache: filepath.Join(dir, "gocache")}
	mod := filepath.Join(dir, "mod")
	if err := writeModule(mod, 0); err != nil {
		return nil, err
	}
	if err := g.build(ctx, mod, g.seedCache); err != nil {
		return nil, fmt.Errorf("warm go build cache: %w", err)
	}
	return g, nil
}

func goEnv(cache string) []string {
	return []string{"GOCACHE=" + cache, "GOTOOLCHAIN=local", "GOPROXY=off", "GOWORK=off",
		"GO111MODULE=on", "CGO_ENABLED=0", "GOFLAGS="}
}

func (g *goBuild) build(ctx context.Context, mod, cache string) error {
	_, err := peer.RunEnv(ctx, mod, goEnv(cache), "go", "build", "-o", filepath.Join(mod, "app"), ".")
	return err
}

// measure copies the module and the seed cache under dir, builds once
// untimed, then n times after changing a constant in every package, and
// returns the seconds of the timed builds.
func (g *goBuild) measure(ctx context.Context, dir string, n int) ([]float64, error) {
	mod, cache := filepath.Join(dir, "mod"), filepath.Join(dir, "gocache")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("go build dir %s: %w", dir, err)
	}
	if _, err := peer.Run(ctx, "", "cp", "-a", g.seedCache, cache); err != nil {
		return nil, fmt.Errorf("copy go build cache: %w", err)
	}
	if err := writeModule(mod, 0); err != nil {
		return nil, err
	}
	if err := g.build(ctx, mod, cache); err != nil {
		return nil, err
	}
	return sample(ctx, n, func(i int) error {
		return writeRevs(mod, i+1)
	}, func(int) error {
		return g.build(ctx, mod, cache)
	}, nil)
}

// writeModule writes the module's sources under dir with constant rev.
func writeModule(dir string, rev int) error {
	files := map[string]string{
		"go.mod": "module benchmod\n\ngo 1.22\n",
	}
	var imports, calls strings.Builder
	for p := 0; p < goBuildPkgs; p++ {
		fmt.Fprintf(&imports, "\t\"benchmod/p%d\"\n", p)
		fmt.Fprintf(&calls, "\t\tp%d.Sum(words),\n", p)
		for f := 0; f < goBuildFiles; f++ {
			var b strings.Builder
			fmt.Fprintf(&b, "package p%d\n\nimport (\n\t\"sort\"\n\t\"strconv\"\n\t\"strings\"\n)\n", p)
			for k := 0; k < goBuildFuncs; k++ {
				fmt.Fprintf(&b, `
// F%[1]d_%[2]d joins a sorted copy of s with a tag.
func F%[1]d_%[2]d(s []string) string {
	t := append([]string(nil), s...)
	sort.Strings(t)
	for i := range t {
		t[i] = strings.ToUpper(t[i]) + strconv.Itoa(i*%[2]d+Rev)
	}
	return strings.Join(t, ",")
}
`, f, k)
			}
			if f == 0 {
				b.WriteString("\n// Sum uses every function of the package.\nfunc Sum(s []string) int {\n\tn := 0\n")
				for ff := 0; ff < goBuildFiles; ff++ {
					for k := 0; k < goBuildFuncs; k++ {
						fmt.Fprintf(&b, "\tn += len(F%d_%d(s))\n", ff, k)
					}
				}
				b.WriteString("\treturn n\n}\n")
			}
			files[fmt.Sprintf("p%d/f%d.go", p, f)] = b.String()
		}
	}
	files["main.go"] = "package main\n\nimport (\n\t\"encoding/json\"\n\t\"fmt\"\n\t\"os\"\n\n" + imports.String() +
		")\n\nfunc main() {\n\twords := os.Args[1:]\n\tb, _ := json.Marshal([]int{\n" + calls.String() +
		"\t})\n\tfmt.Println(string(b))\n}\n"
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("go module dir %s: %w", filepath.Dir(p), err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return fmt.Errorf("go module file %s: %w", p, err)
		}
	}
	return writeRevs(dir, rev)
}

// writeRevs sets constant Rev in every package, which makes every package
// and the binary build again.
func writeRevs(dir string, rev int) error {
	for p := 0; p < goBuildPkgs; p++ {
		path := filepath.Join(dir, fmt.Sprintf("p%d", p), "rev.go")
		text := fmt.Sprintf("package p%d\n\n// Rev changes between builds.\nconst Rev = %d\n", p, rev)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return fmt.Errorf("go module file %s: %w", path, err)
		}
	}
	return nil
}
