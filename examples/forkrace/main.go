// Command forkrace is an orchestrator written against tine's Go client
// (package api/client): it makes a sandbox of a project, forks it N ways,
// runs a task in every fork at once (each fork sees its index in
// $FORK_INDEX, so each can try another idea), and keeps the first fork
// whose test passes; the others are removed.
//
//	go run ./examples/forkrace -from ~/project -n 5 \
//	    -task 'sh ./try-idea.sh $FORK_INDEX' -test 'make test'
//
// It talks to the daemon of the state root given by -root (the daemon must
// be running: "tine serve", or any tine sandbox command starts it).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
)

func main() {
	root := flag.String("root", "/var/lib/tine", "tine's state root (its daemon's socket is ROOT/tine.sock)")
	from := flag.String("from", ".", "the project directory")
	n := flag.Int("n", 5, "how many forks")
	task := flag.String("task", "true", "shell command run in each fork; $FORK_INDEX is 0..n-1")
	test := flag.String("test", "true", "shell command that passes (exit 0) in a good fork")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dir, err := filepath.Abs(*from)
	if err == nil {
		var winner string
		winner, err = race(ctx, client.New(filepath.Join(*root, api.SocketName)), dir, *n, *task, *test)
		if err == nil {
			fmt.Println(winner)
			fmt.Fprintf(os.Stderr, "kept %s; see its changes with \"tine diff %s\", apply them with \"tine promote %s\"\n", winner, winner, winner)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "forkrace:", err)
	os.Exit(1)
}

// race runs task then test in n forks of a sandbox made from dir and
// returns the first fork to pass; every other sandbox it made is removed.
func race(ctx context.Context, c *client.Client, dir string, n int, task, test string) (string, error) {
	base, err := c.Create(ctx, api.CreateRequest{From: dir})
	if err != nil {
		return "", err
	}
	defer c.Remove(context.WithoutCancel(ctx), base.Name)
	forks, err := c.Fork(ctx, base.Name, api.ForkRequest{N: n})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	passed := make(chan string, len(forks))
	failed := make(chan error, len(forks))
	for i, f := range forks {
		go func() {
			sh := func(cmd string) (int, error) {
				ex, err := c.Exec(ctx, f.Name, api.ExecRequest{ExecRequest: proto.ExecRequest{
					Argv: []string{"sh", "-c", cmd}, Dir: f.ProjectPath,
					Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "FORK_INDEX=" + strconv.Itoa(i)},
				}}, client.ExecIO{})
				return ex.Code, err
			}
			code, err := sh(task)
			if err == nil && code == 0 {
				code, err = sh(test)
			}
			switch {
			case err != nil:
				failed <- fmt.Errorf("fork %s: %w", f.Name, err)
			case code != 0:
				failed <- fmt.Errorf("fork %s: exit %d", f.Name, code)
			default:
				passed <- f.Name
			}
		}()
	}
	winner := ""
	var errs []error
	for range forks {
		select {
		case w := <-passed:
			winner = w
		case err := <-failed:
			errs = append(errs, err)
			continue
		}
		break
	}
	cancel() // the others' commands are killed
	for _, f := range forks {
		if f.Name != winner {
			c.Remove(context.WithoutCancel(ctx), f.Name)
		}
	}
	if winner == "" {
		return "", fmt.Errorf("no fork passed: %v", errs)
	}
	return winner, nil
}
