package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
)

// execOpts are the flags of exec.
type execOpts struct {
	stdin, tty bool
	cwd        string
	env        []string
	timeout    time.Duration
	user       string
	// json prints the output and the result as JSON lines (exec --json).
	json bool
}

func (a *app) execCommand() *cobra.Command {
	o := &execOpts{}
	c := &cobra.Command{
		Use:   "exec [flags] SB -- CMD [ARG...]",
		Short: "run a command in a sandbox; its exit code becomes tine's",
		Args:  minArgs(2, "a sandbox and a command: tine exec SB -- CMD [ARG...]"),
		RunE: func(c *cobra.Command, args []string) error {
			if d := c.ArgsLenAtDash(); d >= 0 && d != 1 {
				return usageErr("want exactly one sandbox before --, got %d arguments", d)
			}
			o.json = a.json
			return a.exec(c.Context(), args[0], args[1:], o)
		},
	}
	f := c.Flags()
	f.BoolVarP(&o.stdin, "interactive", "i", false, "pass standard input to the command")
	f.BoolVarP(&o.tty, "tty", "t", false, "run the command on a terminal (raw mode, window size followed)")
	f.StringVar(&o.cwd, "cwd", "", "working directory (default: the project directory)")
	f.StringArrayVar(&o.env, "env", nil, "KEY=VALUE added to the sandbox's environment (repeatable)")
	f.DurationVar(&o.timeout, "timeout", 0, "kill the command after this long, such as 30s (0: never)")
	f.StringVar(&o.user, "user", "", "run as USER or UID[:GID] (default: root)")
	return c
}

func (a *app) shellCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "shell SB",
		Short: "an interactive shell in a sandbox ($SHELL, else /bin/sh)",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			sh := os.Getenv("SHELL")
			if sh == "" {
				sh = "/bin/sh"
			}
			return a.exec(c.Context(), args[0], []string{sh}, &execOpts{stdin: true, tty: true})
		},
	}
}

// forwarded are the signals tine passes on to a command it runs.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// execResult is the last line of exec --json: how the command ended.
type execResult struct {
	// ExitCode is tine's exit status: the command's, 128+N when signal N
	// killed it, 127 or 126 when it did not start, 1 or 2 for tine's own
	// failures.
	ExitCode int  `json:"exit_code"`
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
	// KilledBy and KilledReason say what outside the command killed it,
	// as the API's exit event does: oom, stopped, removed or lifetime.
	KilledBy     string `json:"killed_by,omitempty"`
	KilledReason string `json:"killed_reason,omitempty"`
	// Error is why the command did not run or tine failed, as the API
	// says it (code, message and for a command that did not start its
	// exit_code).
	Error *api.Error `json:"error,omitempty"`
}

// jsonLines writes one JSON object a line, from several goroutines.
type jsonLines struct {
	mu sync.Mutex
	w  io.Writer
}

func (j *jsonLines) line(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.w.Write(append(b, '\n'))
}

// jsonOutput writes a command's stdout or stderr as the API's ExecEvent
// lines, {"stdout":B64} or {"stderr":B64}.
type jsonOutput struct {
	j      *jsonLines
	stderr bool
}

func (o jsonOutput) Write(b []byte) (int, error) {
	if o.stderr {
		o.j.line(api.ExecEvent{Stderr: b})
	} else {
		o.j.line(api.ExecEvent{Stdout: b})
	}
	return len(b), nil
}

// exec runs argv in sandbox sb and returns its exit code as an exitCode.
// With o.json, the command's output goes to stdout as ExecEvent lines and
// an execResult line ends it, whatever the outcome.
func (a *app) exec(ctx context.Context, sb string, argv []string, o *execOpts) error {
	if !o.json {
		return a.execRun(ctx, sb, argv, o, nil)
	}
	res := &execResult{}
	j := &jsonLines{w: a.stdout}
	err := a.execRun(ctx, sb, argv, o, &execJSON{j, res})
	res.ExitCode = exitStatus(err)
	if ec := exitCode(0); err != nil && !errors.As(err, &ec) {
		// tine's own failure: the API's code when the daemon gave one,
		// and what tine prints on stderr.
		if res.Error == nil {
			res.Error = &api.Error{Code: "internal"}
			if errors.Is(err, errUsage) {
				res.Error.Code = "bad_request"
			}
		}
		res.Error.Message = err.Error()
	}
	j.line(res)
	return err
}

// execJSON is where execRun reports for exec --json.
type execJSON struct {
	lines *jsonLines
	res   *execResult
}

// fail keeps the API's error, when err holds one, for the result and
// returns err as sbErr words it. A nil js only words it.
func (js *execJSON) fail(sb string, err error) error {
	if ce := (*client.Error)(nil); js != nil && errors.As(err, &ce) {
		js.res.Error = &api.Error{Code: ce.Code, Message: ce.Message, ExitCode: ce.ExitCode}
	}
	return sbErr(sb, err)
}

// execRun is exec; js is nil without --json.
func (a *app) execRun(ctx context.Context, sb string, argv []string, o *execOpts, js *execJSON) error {
	req := api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: argv, Dir: o.cwd, TTY: o.tty}, Timeout: o.timeout}
	for _, e := range o.env {
		if !strings.Contains(e, "=") {
			return usageErr("--env %q: want KEY=VALUE", e)
		}
	}
	if o.timeout < 0 {
		return usageErr("--timeout %s: want a duration of 0 (none) or more, such as 30s", o.timeout)
	}
	if o.cwd != "" && !strings.HasPrefix(o.cwd, "/") {
		return usageErr("--cwd %q: want an absolute path in the sandbox (without --cwd: the project directory)", o.cwd)
	}
	if o.user != "" {
		uid, gid, err := lookupUser(o.user)
		if err != nil {
			return usageErr("--user: %v", err)
		}
		req.UID, req.GID = &uid, gid
	}
	cl, err := a.daemon(ctx)
	if err != nil {
		return err
	}
	if len(o.env) > 0 {
		// The request's environment replaces the sandbox's: start from it.
		s, err := cl.Get(ctx, sb)
		if err != nil {
			return js.fail(sb, err)
		}
		req.Env = append(append([]string(nil), s.Env...), o.env...)
	}
	// Signals go to the command, not to tine: the stream ends when the
	// command does. The third SIGINT, SIGTERM or SIGHUP ends tine itself
	// (the daemon then ends the command), for a command that cannot act
	// on them: one in a frozen sandbox, or one not started yet.
	ctx, giveUp := context.WithCancel(context.WithoutCancel(ctx))
	defer giveUp()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	sigOut := make(chan proto.Signal, 8)
	// Without -i the command's stdin is empty, and closed at once.
	io := client.ExecIO{Stdin: strings.NewReader(""), Stdout: a.stdout, Stderr: a.stderr, Signals: sigOut}
	if js != nil {
		io.Stdout, io.Stderr = jsonOutput{j: js.lines}, jsonOutput{j: js.lines, stderr: true}
	}
	if o.stdin {
		io.Stdin = a.stdin
	}
	stop := make(chan struct{})
	defer close(stop)
	if o.tty {
		restore, resize := a.terminal(stop)
		defer restore()
		io.Resize = resize
		if r, ok := <-resize; ok {
			req.Rows, req.Cols = r.Rows, r.Cols
		}
	}
	gaveUp := make(chan os.Signal, 1)
	go func() {
		ending := 0
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGINT || s == syscall.SIGTERM || s == syscall.SIGHUP {
					if ending++; ending == 3 {
						gaveUp <- s
						giveUp()
						return
					}
				}
				select {
				case sigOut <- proto.Signal{Signal: int(s.(syscall.Signal))}:
				default:
				}
			case <-stop:
				return
			}
		}
	}()
	exit, err := cl.Exec(ctx, sb, req, io)
	select {
	case s := <-gaveUp:
		fmt.Fprintf(a.stderr, "tine exec: stopped waiting for %s in sandbox %s after the third %v; the daemon ends it\n", argv[0], sb, s)
		return exitCode(128 + int(s.(syscall.Signal)))
	default:
	}
	if err != nil {
		if ce := (*client.Error)(nil); errors.As(err, &ce) && ce.ExitCode != 0 {
			// The command did not start: the exit status a shell gives
			// (127 not found, 126 not executable), the reason on stderr.
			js.fail(sb, err)
			fmt.Fprintf(a.stderr, "tine exec: %s\n", ce.Message)
			return exitCode(ce.ExitCode)
		}
		return js.fail(sb, err)
	}
	if js != nil {
		js.res.Signal, js.res.TimedOut = exit.Signal, exit.TimedOut
		js.res.KilledBy, js.res.KilledReason = exit.KilledBy, exit.KilledReason
	}
	if exit.TimedOut {
		fmt.Fprintf(a.stderr, "tine exec: %s in sandbox %s was killed after --timeout %s\n", argv[0], sb, o.timeout)
	}
	if exit.KilledBy != "" {
		why := exit.KilledReason
		if why == "" {
			why = exit.KilledBy
		}
		fmt.Fprintf(a.stderr, "tine exec: sandbox %q: killed: %s\n", sb, why)
	}
	if exit.Signal != 0 {
		return exitCode(128 + exit.Signal)
	}
	if exit.Code != 0 {
		return exitCode(exit.Code)
	}
	return nil
}

// terminal puts standard input in raw mode when it is a terminal and
// reports the window size now and at every change, until stop closes.
// The first size is in the channel when it returns.
func (a *app) terminal(stop <-chan struct{}) (restore func(), sizes <-chan proto.Resize) {
	ch := make(chan proto.Resize, 4)
	restore = func() {}
	in := int(os.Stdin.Fd())
	if f, ok := a.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		in = int(f.Fd())
		if st, err := term.MakeRaw(in); err == nil {
			restore = func() { term.Restore(in, st) }
		}
	}
	size := func() (proto.Resize, bool) {
		for _, fd := range []int{in, int(os.Stdout.Fd()), int(os.Stderr.Fd())} {
			if w, h, err := term.GetSize(fd); err == nil {
				return proto.Resize{Rows: uint16(h), Cols: uint16(w)}, true
			}
		}
		return proto.Resize{}, false
	}
	if s, ok := size(); ok {
		ch <- s
	} else {
		ch <- proto.Resize{Rows: 24, Cols: 80}
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		defer signal.Stop(winch)
		for {
			select {
			case <-winch:
				if s, ok := size(); ok {
					select {
					case ch <- s:
					default:
					}
				}
			case <-stop:
				return
			}
		}
	}()
	return restore, ch
}

// lookupUser turns USER, UID or UID:GID into ids; a name is looked up in
// the host's user database, which the sandbox's OS layer starts from.
func lookupUser(s string) (uint32, *uint32, error) {
	name, group, hasGroup := strings.Cut(s, ":")
	var uid uint32
	var gid *uint32
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		uid = uint32(n)
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return 0, nil, fmt.Errorf("user %q: %v (give a numeric UID[:GID])", name, err)
		}
		n, _ := strconv.ParseUint(u.Uid, 10, 32)
		g, _ := strconv.ParseUint(u.Gid, 10, 32)
		uid = uint32(n)
		g32 := uint32(g)
		gid = &g32
	}
	if hasGroup {
		g, err := strconv.ParseUint(group, 10, 32)
		if err != nil {
			return 0, nil, fmt.Errorf("group %q: want a numeric GID", group)
		}
		g32 := uint32(g)
		gid = &g32
	}
	return uid, gid, nil
}
