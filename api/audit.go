package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"

	"tine/audit"
	"tine/sandbox"
)

// auditName returns the sandbox the path names, "" for the daemon's log
// routes. A removed sandbox's log stays readable.
func auditName(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.PathValue("name") == "" {
		return "", true
	}
	return pathName(w, r)
}

// auditLog answers GET /v1/audit and /v1/sandboxes/{name}/audit with the
// log's records as NDJSON, from record ?from=N (default 0); with
// ?follow=1 the stream goes on with each new record until the client
// leaves.
func (s *Server) auditLog(w http.ResponseWriter, r *http.Request) {
	name, ok := auditName(w, r)
	if !ok {
		return
	}
	from, err := strconv.ParseInt(r.URL.Query().Get("from"), 10, 64)
	if r.URL.Query().Get("from") == "" {
		from, err = 0, nil
	}
	if err != nil || from < 0 {
		writeError(w, badRequest("query from=%q: want a record number, 0 or more", r.URL.Query().Get("from")))
		return
	}
	follow := r.URL.Query().Get("follow") == "1" || r.URL.Query().Get("follow") == "true"
	path, err := s.m.AuditPath(name)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if _, gerr := s.m.Get(name); name != "" && gerr != nil {
			writeError(w, fmt.Errorf("audit log of sandbox %q: %w", name, sandbox.ErrNotFound))
			return
		}
	}
	var changed <-chan struct{}
	if follow {
		l, err := s.m.AuditLog(name)
		if err != nil {
			writeError(w, err)
			return
		}
		changed = l.Changed()
	}
	ctx, cancel := s.context(r)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	next := from
	for {
		if l, err := s.m.AuditLog(name); err == nil && follow {
			changed = l.Changed() // before reading, so no append is missed
		}
		f, err := os.Open(path)
		if err == nil {
			err = audit.ReadAll(f, next, func(rec *audit.Record) error {
				next = int64(rec.Seq) + 1
				return enc.Encode(rec)
			})
			f.Close()
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			enc.Encode(map[string]any{"error": err.Error()})
			return
		}
		if rc.Flush() != nil || !follow {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// VerifyResponse answers GET /v1/audit/verify and
// /v1/sandboxes/{name}/audit/verify.
type VerifyResponse struct {
	// Log is the log's name: a sandbox's, or "daemon".
	Log    string        `json:"log"`
	Report *audit.Report `json:"report"`
}

// auditVerify checks a log against its head file; ?head=SEQ+HASH checks
// it against a head kept elsewhere instead.
func (s *Server) auditVerify(w http.ResponseWriter, r *http.Request) {
	name, ok := auditName(w, r)
	if !ok {
		return
	}
	path, err := s.m.AuditPath(name)
	if err != nil {
		writeError(w, err)
		return
	}
	logName := name
	if logName == "" {
		logName = "daemon"
	}
	var rep *audit.Report
	if h := r.URL.Query().Get("head"); h != "" {
		head, err := audit.ParseHead(h)
		if err != nil {
			writeError(w, badRequest("query head: %v", err))
			return
		}
		f, err := os.Open(path)
		if err != nil {
			writeError(w, auditMissing(name, err))
			return
		}
		rep = audit.Verify(io.Reader(f), &head)
		f.Close()
	} else if rep, err = audit.VerifyFile(path); err != nil {
		writeError(w, auditMissing(name, err))
		return
	}
	writeJSON(w, http.StatusOK, &VerifyResponse{Log: logName, Report: rep})
}

func auditMissing(name string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("audit log of sandbox %q: %w (it has no records)", name, sandbox.ErrNotFound)
	}
	return err
}
