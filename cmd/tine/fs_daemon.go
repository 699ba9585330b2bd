package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/spf13/pflag"

	"tine/api"
	"tine/cowfs"
)

// fsService runs "tine fs" commands in the daemon against its open
// filesystem: typed requests (command, positional arguments, flag values)
// instead of a command line, so the daemon does not depend on the CLI's
// parser. Mounts it makes live until they are unmounted from outside or
// the daemon stops.
type fsService struct {
	f      *cowfs.FS
	ctx    context.Context
	cancel context.CancelFunc
	mounts sync.WaitGroup
}

func newFSService(f *cowfs.FS) *fsService {
	ctx, cancel := context.WithCancel(context.Background())
	return &fsService{f: f, ctx: ctx, cancel: cancel}
}

// run carries out one fs command, writing what it prints to w. A usage
// error comes back as an *api.Error with code bad_request, so the client
// exits 2 as it would have run locally.
func (s *fsService) run(ctx context.Context, command string, req api.FSRequest, w io.Writer) error {
	err := s.do(ctx, command, req, w)
	if errors.Is(err, errUsage) {
		return &api.Error{Code: "bad_request", Message: strings.TrimPrefix(err.Error(), errUsage.Error()+": ")}
	}
	return err
}

func (s *fsService) do(ctx context.Context, command string, req api.FSRequest, w io.Writer) error {
	c, ok := lookupFS(command)
	if !ok {
		return usageErr("unknown fs command %q; see \"tine fs --help\"", command)
	}
	if len(req.Args) != len(c.args) {
		return usageErr("fs %s: want %d arguments (%s), got %d", c.name, len(c.args), strings.Join(c.args, " "), len(req.Args))
	}
	o := &fsOpts{json: req.JSON, root: s.f.Root()}
	fl := pflag.NewFlagSet("fs "+c.name, pflag.ContinueOnError)
	if c.flags != nil {
		c.flags(fl, o)
	}
	for name, v := range req.Opts {
		if fl.Lookup(name) == nil {
			return usageErr("fs %s: unknown flag --%s", c.name, name)
		}
		if err := fl.Set(name, v); err != nil {
			return usageErr("fs %s: --%s: %v", c.name, name, err)
		}
	}
	if c.name == "mount" {
		if err := s.mount(req.Args[0], req.Args[1], o); err != nil {
			return err
		}
		fmt.Fprintf(w, "mounted %s at %s\n", req.Args[0], req.Args[1])
		return nil
	}
	// Notes (what stderr shows when run locally) go to the daemon's log.
	return c.do(ctx, s.f, o, req.Args, w)
}

// mount serves branch at dir until it is unmounted or the service closes.
func (s *fsService) mount(branch, dir string, o *fsOpts) error {
	m, err := s.f.Mount(s.ctx, branch, dir, o.mountOptions())
	if err != nil {
		return err
	}
	s.mounts.Add(1)
	go func() {
		defer s.mounts.Done()
		done := make(chan struct{})
		go func() {
			m.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-s.ctx.Done():
		}
		m.Unmount()
	}()
	return nil
}

// close unmounts what the service mounted.
func (s *fsService) close() {
	s.cancel()
	s.mounts.Wait()
}
