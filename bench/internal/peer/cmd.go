package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// Require reports an error naming every program in names that is not on
// PATH, or nil when all are present.
func Require(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("not on PATH: %s", strings.Join(missing, ", "))
	}
	return nil
}

// Run runs name with args in dir (the current directory when dir is "")
// and returns its standard output. On failure the error names the command
// and carries the tail of its standard error.
func Run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	return RunEnv(ctx, dir, nil, name, args...)
}

// RunEnv is Run with extra environment variables (KEY=VALUE) added to the
// process's own environment.
func RunEnv(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	var out, errb bytes.Buffer
	if err := RunTo(ctx, dir, env, &out, &errb, name, args...); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(errb.String(), 600))
	}
	return out.Bytes(), nil
}

// RunTo runs name with args in dir, streaming its standard output and
// standard error to stdout and stderr (either may be nil to discard).
func RunTo(ctx context.Context, dir string, env []string, stdout, stderr io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	return cmd.Run()
}

// Git runs git in the repository or worktree dir with a fixed identity and
// without the user's or the system's configuration, so results do not
// depend on the host.
func Git(ctx context.Context, dir string, args ...string) ([]byte, error) {
	env := []string{
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@localhost",
		"GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@localhost",
		"GIT_AUTHOR_DATE=2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2000-01-01T00:00:00Z",
	}
	return RunEnv(ctx, dir, env, "git", append([]string{"-c", "gc.auto=0", "-c", "maintenance.auto=0"}, args...)...)
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
