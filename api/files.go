package api

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strconv"

	"tine/guestagent/client"
)

// getFile answers GET /v1/sandboxes/{name}/files?path=P with the file's
// bytes. An error after the first byte aborts the response, so a client
// never takes a cut file for a whole one.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	s.download(w, r, "application/octet-stream", func(c *client.Client, p string, lw io.Writer) error {
		_, err := c.GetFile(r.Context(), p, lw)
		return err
	})
}

// download answers a GET of a sandbox's path (?path=P) with what get
// writes for it, sent as contentType from its first byte; an error after
// that aborts the response.
func (s *Server) download(w http.ResponseWriter, r *http.Request, contentType string, get func(c *client.Client, p string, lw io.Writer) error) {
	c, p, ok := s.agentPath(w, r)
	if !ok {
		return
	}
	lw := &lazyWriter{w: w, contentType: contentType}
	if err := get(c, p, lw); err != nil {
		if lw.started {
			panic(http.ErrAbortHandler)
		}
		writeError(w, fileError(err))
		return
	}
	if !lw.started {
		lw.start()
	}
}

// agentPath returns the sandbox's agent and the request's path parameter,
// or answers the request with what is wrong.
func (s *Server) agentPath(w http.ResponseWriter, r *http.Request) (*client.Client, string, bool) {
	c, ok := s.agent(w, r)
	if !ok {
		return nil, "", false
	}
	p := r.URL.Query().Get("path")
	if err := checkPath("path", p); err != nil {
		writeError(w, err)
		return nil, "", false
	}
	return c, p, true
}

// fileError reports a guest agent's refusal of a path as a bad request.
func fileError(err error) error {
	if errors.Is(err, client.ErrClosed) || errors.Is(err, context.Canceled) {
		return err
	}
	return &Error{Code: "bad_request", Message: err.Error()}
}

// lazyWriter sends the response's header at the first byte.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (l *lazyWriter) start() {
	l.started = true
	l.w.Header().Set("Content-Type", l.contentType)
	l.w.WriteHeader(http.StatusOK)
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	if !l.started {
		l.start()
	}
	return l.w.Write(b)
}

// putFile answers PUT /v1/sandboxes/{name}/files?path=P&mode=0644: the
// body becomes the file, whole or not at all. Its size is bounded by the
// sandbox's project quota where the path lies in the project.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.agentPath(w, r)
	if !ok {
		return
	}
	mode := uint32(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = ParseMode(m); err != nil {
			writeError(w, badRequest("parameter \"mode\" %q: %v", m, err))
			return
		}
	}
	if err := c.PutFile(r.Context(), p, fileMode(mode), r.Body); err != nil {
		writeError(w, fileError(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ParseMode reads permission bits written in octal, such as 0644 or
// 755, at most 07777.
func ParseMode(s string) (uint32, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errors.New("want octal permission bits such as 0644, at most 07777")
	}
	return uint32(m), nil
}

// fileMode turns 07777 bits into a FileMode.
func fileMode(bits uint32) fs.FileMode {
	m := fs.FileMode(bits & 0o777)
	if bits&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if bits&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if bits&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// getArchive answers GET /v1/sandboxes/{name}/archive?path=P with a tar
// stream of the file, symlink or directory tree at P, its top entry
// named as P's last element. An error after the first byte aborts the
// response, so a client never takes a cut archive for a whole one.
func (s *Server) getArchive(w http.ResponseWriter, r *http.Request) {
	s.download(w, r, "application/x-tar", func(c *client.Client, p string, lw io.Writer) error {
		return c.GetTree(r.Context(), p, lw)
	})
}

// putArchive answers PUT /v1/sandboxes/{name}/archive?path=P[&into=true]
// with an ArchivePut: the body, a tar stream of one top entry, lands
// inside P when P is an existing directory (required with into) and as P
// otherwise. A new tree appears whole or not at all; into an existing
// one, each file does.
func (s *Server) putArchive(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.agentPath(w, r)
	if !ok {
		return
	}
	into := false
	if v := r.URL.Query().Get("into"); v != "" {
		var err error
		if into, err = strconv.ParseBool(v); err != nil {
			writeError(w, badRequest("parameter \"into\" %q: want true or false", v))
			return
		}
	}
	dest, err := c.PutTree(r.Context(), p, into, r.Body)
	if err != nil {
		writeError(w, fileError(err))
		return
	}
	writeJSON(w, http.StatusOK, ArchivePut{Path: dest})
}

// ArchivePut says where a PUT .../archive put its copy.
type ArchivePut struct {
	// Path is the copy's absolute path in the sandbox.
	Path string `json:"path"`
}
