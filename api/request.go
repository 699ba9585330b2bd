package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"regexp"
	"strings"
	"sync"

	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/internal/pathjson"
	"tine/oci"
	"tine/sandbox"
)

// MaxRequestBytes bounds the JSON body of a request and each message of
// an interactive exec.
const MaxRequestBytes = 1 << 20

// MaxForks is the most forks one fork request makes.
const MaxForks = 64

// Bounds on what one request may ask for.
const (
	maxArgs     = 4096
	maxListLen  = 1024
	maxItemLen  = 64 << 10
	maxTimeout  = 365 * 24 * 60 * 60 * 1e9 // a year, in nanoseconds
	maxTermSize = 10000
)

// nameRE is what a sandbox, snapshot or label name may be.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) })

var fsCommandRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z-]{0,31}$`) })

func validName(s string) bool { return nameRE().MatchString(s) }

// badRequest is a 400 error; the message names the field and what to do.
func badRequest(format string, a ...any) *Error {
	return &Error{Code: "bad_request", Message: fmt.Sprintf(format, a...)}
}

// pathName returns the {name} of the request's path, or answers 400.
func pathName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("name")
	if !validName(name) {
		writeError(w, badRequest("sandbox name %q in the path: want 1-63 of [A-Za-z0-9._-], starting with a letter or digit", name))
		return "", false
	}
	return name, true
}

// decodeJSON decodes one JSON value of at most MaxRequestBytes from b into
// v, refusing unknown fields and trailing data. An empty body leaves v as
// it is.
func decodeJSON(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("request body: %s; send one JSON object as docs/api/openapi.json describes", jsonProblem(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body: data after the JSON object; send exactly one object")
	}
	return nil
}

// jsonProblem words a decoding error without Go type names where it can.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q: got a JSON %s, want %s", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se)
	}
	return err.Error() // unknown field "x", unexpected EOF
}

func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"), strings.HasPrefix(k, "float"):
		return "a number"
	case k == "string":
		return "a string"
	case k == "bool":
		return "true or false"
	case k == "slice", k == "array":
		return "an array"
	default:
		return "an object"
	}
}

// decode reads the request's JSON body into v, or answers 400 or 413.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err == nil {
		err = decodeJSON(b, v)
	}
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		err = &Error{Code: "too_large", Message: fmt.Sprintf("request body exceeds %d bytes; send less", MaxRequestBytes)}
	}
	if err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// decodeEmpty accepts an empty body or an empty JSON object.
func decodeEmpty(w http.ResponseWriter, r *http.Request) bool {
	var v struct{}
	return decode(w, r, &v)
}

// isDir says whether a CreateRequest.From is a host directory.
func isDir(from string) bool { return strings.HasPrefix(from, "/") }

func (req *CreateRequest) validate() error {
	if req.Name != "" && !validName(req.Name) {
		return badRequest("field \"name\" %q: want 1-63 of [A-Za-z0-9._-], starting with a letter or digit, or leave it out for a generated name", req.Name)
	}
	switch {
	case req.From == "":
		return badRequest("field \"from\" is empty: give an absolute host directory or a sandbox snapshot id")
	case isDir(req.From):
		if err := checkPath("from", req.From); err != nil {
			return err
		}
	default:
		id, label, hasLabel := strings.Cut(req.From, ":")
		if !validName(id) || hasLabel && !validName(label) {
			return badRequest("field \"from\" %q: want an absolute host directory (starting with /), a snapshot id, or SANDBOX:LABEL", req.From)
		}
	}
	if err := checkList("services", req.Services); err != nil {
		return err
	}
	if err := checkEnv("env", req.Env); err != nil {
		return err
	}
	if err := req.Limits.Check(); err != nil {
		return badRequest("field \"limits\": %v", err)
	}
	if _, err := sandbox.ParseMessagePolicy(req.MessageTo); err != nil {
		return badRequest("field \"message_to\": %v", err)
	}
	if req.Image != "" {
		if err := checkRef("image", req.Image); err != nil {
			return err
		}
	}
	if req.ImageWorkdir != "" {
		if err := checkPath("image_workdir", req.ImageWorkdir); err != nil {
			return err
		}
	}
	return nil
}

func (req *ForkRequest) validate() error {
	if req.N == 0 && len(req.Names) > 0 {
		req.N = len(req.Names)
	}
	if req.N == 0 {
		req.N = 1
	}
	if req.N < 1 || req.N > MaxForks {
		return badRequest("field \"n\" is %d: want 1 to %d forks", req.N, MaxForks)
	}
	if len(req.Names) > 0 && len(req.Names) != req.N {
		return badRequest("field \"names\" has %d names for %d forks: give one name per fork or none", len(req.Names), req.N)
	}
	seen := map[string]bool{}
	for _, n := range req.Names {
		if !validName(n) {
			return badRequest("field \"names\": %q: want 1-63 of [A-Za-z0-9._-], starting with a letter or digit", n)
		}
		if seen[n] {
			return badRequest("field \"names\": %q is given twice", n)
		}
		seen[n] = true
	}
	return nil
}

func (req *FSRequest) validate() error {
	if err := checkList("args", req.Args); err != nil {
		return err
	}
	if len(req.Opts) > maxListLen {
		return badRequest("field \"opts\" has %d entries, more than %d", len(req.Opts), maxListLen)
	}
	for k, v := range req.Opts {
		if !fsCommandRE().MatchString(k) {
			return badRequest("field \"opts\": flag name %q: want a long flag name without dashes, such as root", k)
		}
		if len(v) > maxItemLen || strings.IndexByte(v, 0) >= 0 {
			return badRequest("field \"opts\": flag %q: value longer than %d bytes or holding a NUL byte", k, maxItemLen)
		}
	}
	return nil
}

// validate checks an exec request; the process needs a command line.
func (req *ExecRequest) validate() error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return badRequest("field \"argv\" is empty: give the command and its arguments, such as [\"sh\", \"-c\", \"make\"]")
	}
	if len(req.Argv) > maxArgs {
		return badRequest("field \"argv\" has %d arguments, more than %d", len(req.Argv), maxArgs)
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return badRequest("field \"argv\": an argument holds a NUL byte")
		}
	}
	if err := checkEnv("env", req.Env); err != nil {
		return err
	}
	if req.Dir != "" {
		if err := checkPath("dir", req.Dir); err != nil {
			return err
		}
	}
	if req.Timeout < 0 || req.Timeout > maxTimeout {
		return badRequest("field \"timeout\" is %d: want nanoseconds from 0 (none) to a year", req.Timeout)
	}
	if req.Rows > maxTermSize || req.Cols > maxTermSize {
		return badRequest("fields \"rows\" and \"cols\" are %dx%d: want at most %d each", req.Rows, req.Cols, maxTermSize)
	}
	return nil
}

// checkInput checks one message from the client of an interactive exec.
func (in *ExecInput) validate() error {
	if in.Resize != nil && (in.Resize.Rows == 0 || in.Resize.Cols == 0 || in.Resize.Rows > maxTermSize || in.Resize.Cols > maxTermSize) {
		return badRequest("field \"resize\" is %dx%d: want rows and cols from 1 to %d", in.Resize.Rows, in.Resize.Cols, maxTermSize)
	}
	if in.Signal != nil && (in.Signal.Signal < 1 || in.Signal.Signal > 64) {
		return badRequest("field \"signal\" is %d: want a signal number from 1 to 64", in.Signal.Signal)
	}
	return nil
}

// checkPath checks that an absolute path is clean text.
func checkPath(field, p string) error {
	if !path.IsAbs(p) || len(p) > 4096 || strings.IndexByte(p, 0) >= 0 {
		return badRequest("field %q %q: want an absolute path of at most 4096 bytes, without NUL", field, p)
	}
	return nil
}

func checkList(field string, l []string) error {
	if len(l) > maxListLen {
		return badRequest("field %q has %d entries, more than %d", field, len(l), maxListLen)
	}
	for _, s := range l {
		if len(s) > maxItemLen || strings.IndexByte(s, 0) >= 0 {
			return badRequest("field %q: an entry is longer than %d bytes or holds a NUL byte", field, maxItemLen)
		}
	}
	return nil
}

func checkEnv(field string, env []string) error {
	if err := checkList(field, env); err != nil {
		return err
	}
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return badRequest("field %q: %q is not KEY=value", field, kv)
		}
	}
	return nil
}

// changesOf turns cowfs changes into the API's.
func changesOf(cs []cowfs.Change) []Change {
	out := make([]Change, len(cs))
	for i, c := range cs {
		out[i] = changeOf(c)
	}
	return out
}

// changeOf turns one cowfs change into the API's.
func changeOf(c cowfs.Change) Change {
	ch := Change{Path: strings.ToValidUTF8(c.Path, "\uFFFD"), PathB64: pathjson.B64(c.Path), Kind: c.Kind.String()}
	e := c.New
	if e == nil {
		e = c.Old
	}
	if e != nil {
		ch.Type, ch.Size, ch.Mode = e.Type.String(), e.Size, e.Mode
	}
	if c.Kind == cowfs.TypeChanged && c.Old != nil {
		ch.OldType = c.Old.Type.String()
	}
	return ch
}

// changeWriter writes a JSON array of Change, one element at a time, so
// that a diff of a million files is never held as API values or as one
// encoded buffer. The status (200) goes with the first element.
type changeWriter struct {
	w       http.ResponseWriter
	bw      *bufio.Writer
	started bool
}

func newChangeWriter(w http.ResponseWriter) *changeWriter {
	return &changeWriter{w: w, bw: bufio.NewWriterSize(w, 64<<10)}
}

func (c *changeWriter) start() {
	c.w.Header().Set("Content-Type", "application/json")
	c.w.WriteHeader(http.StatusOK)
	c.bw.WriteByte('[')
	c.started = true
}

// write adds one change; its error (the client went away) ends the walk.
func (c *changeWriter) write(ch cowfs.Change) error {
	if !c.started {
		c.start()
	} else {
		c.bw.WriteByte(',')
	}
	b, _ := json.Marshal(changeOf(ch)) // a Change always encodes
	_, err := c.bw.Write(b)
	return err
}

// end closes the array (an empty one when nothing was written).
func (c *changeWriter) end() {
	if !c.started {
		c.start()
	}
	c.bw.WriteString("]\n")
	c.bw.Flush()
}

// statusOf maps an error to its API code and HTTP status.
func statusOf(err error) (int, *Error) {
	var e *Error
	if errors.As(err, &e) {
		return codeStatus(e.Code), e
	}
	msg := err.Error()
	if se := (*sandbox.StartError)(nil); errors.As(err, &se) {
		code := map[string]string{proto.CodeNotFound: CodeCommandNotFound, proto.CodeNotExecutable: CodeCommandNotExecutable,
			proto.CodeBadDir: CodeBadDir}[se.Code]
		if code != "" {
			return http.StatusUnprocessableEntity, &Error{Code: code, Message: msg, ExitCode: se.ExitStatus()}
		}
	}
	switch {
	case errors.Is(err, sandbox.ErrBadName):
		return http.StatusBadRequest, &Error{Code: "bad_request", Message: msg}
	case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, oci.ErrNotFound):
		return http.StatusNotFound, &Error{Code: "not_found", Message: msg}
	case errors.Is(err, sandbox.ErrExists):
		return http.StatusConflict, &Error{Code: "exists", Message: msg}
	case errors.Is(err, sandbox.ErrNotRunning):
		return http.StatusConflict, &Error{Code: "not_running", Message: msg + "; start it first"}
	case errors.Is(err, sandbox.ErrDenied):
		return http.StatusForbidden, &Error{Code: "denied", Message: msg}
	case errors.Is(err, sandbox.ErrFrozen), errors.Is(err, sandbox.ErrBelowUsage), errors.Is(err, sandbox.ErrPromoting),
		errors.Is(err, sandbox.ErrDamaged):
		return http.StatusConflict, &Error{Code: "conflict", Message: msg}
	}
	return http.StatusInternalServerError, &Error{Code: "internal", Message: msg}
}

// codeStatus is the HTTP status of an error code.
func codeStatus(code string) int {
	switch code {
	case "bad_request":
		return http.StatusBadRequest
	case "not_found":
		return http.StatusNotFound
	case "denied", "forbidden":
		return http.StatusForbidden
	case "exists", "not_running", "conflict":
		return http.StatusConflict
	case "too_large":
		return http.StatusRequestEntityTooLarge
	case "not_implemented":
		return http.StatusNotImplemented
	case CodeCommandNotFound, CodeCommandNotExecutable, CodeBadDir:
		return http.StatusUnprocessableEntity
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	status, e := statusOf(err)
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":"internal","message":"encode the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
