package api

import (
	"fmt"
	"net/http"
	"path"
	"sort"
	"strings"

	"tine/oci"
	"tine/sandbox"
)

// Image is an image as the API reports it: GET /v1/images lists them.
type Image = oci.Image

// PullRequest is the body of POST /v1/images/pull.
type PullRequest struct {
	// Ref is [REGISTRY/]REPOSITORY[:TAG|@DIGEST].
	Ref string `json:"ref"`
}

// ImportRequest is the body of POST /v1/images/import.
type ImportRequest struct {
	// Path is a docker save tarball or an OCI image layout directory on
	// the daemon's host (absolute).
	Path string `json:"path"`
	// Name names the image; the default is the tarball's tag, the
	// layout's ref.name, or the file's name.
	Name string `json:"name,omitempty"`
}

// RemoveImageResponse is the answer of DELETE /v1/images/{ref}.
type RemoveImageResponse struct {
	Digest string `json:"digest"`
	// Removed says the image's files went; false when only the name went
	// (the image has others).
	Removed bool `json:"removed"`
}

// maxRefLen bounds an image reference or name.
const maxRefLen = 1024

func checkRef(field, ref string) error {
	if ref == "" || len(ref) > maxRefLen || strings.ContainsAny(ref, "\x00\n ") {
		return badRequest("field %q %q: want an image reference ([REGISTRY/]REPOSITORY[:TAG|@DIGEST]) of at most %d bytes", field, ref, maxRefLen)
	}
	return nil
}

func (req *PullRequest) validate() error { return checkRef("ref", req.Ref) }

func (req *ImportRequest) validate() error {
	if err := checkPath("path", req.Path); err != nil {
		return err
	}
	if req.Name != "" {
		return checkRef("name", req.Name)
	}
	return nil
}

// images returns the image store, or answers 501.
func (s *Server) images(w http.ResponseWriter) (*oci.Store, bool) {
	if s.o.Images == nil {
		writeError(w, &Error{Code: "not_implemented", Message: "this daemon keeps no images (it was started without an image store)"})
		return nil, false
	}
	return s.o.Images, true
}

func (s *Server) imageList(w http.ResponseWriter, r *http.Request) {
	st, ok := s.images(w)
	if !ok {
		return
	}
	list, err := st.List()
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []*oci.Image{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) imageGet(w http.ResponseWriter, r *http.Request) {
	st, ok := s.images(w)
	if !ok {
		return
	}
	ref := r.PathValue("ref")
	if err := checkRef("ref", ref); err != nil {
		writeError(w, err)
		return
	}
	im, err := st.Get(ref)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, im)
}

func (s *Server) imagePull(w http.ResponseWriter, r *http.Request) {
	st, ok := s.images(w)
	if !ok {
		return
	}
	var req PullRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := s.context(r)
	defer cancel()
	im, err := st.Pull(ctx, req.Ref)
	if err != nil {
		writeError(w, &Error{Code: "bad_request", Message: err.Error() + " (check the name, the network and docker login for a private registry)"})
		return
	}
	writeJSON(w, http.StatusOK, im)
}

func (s *Server) imageImport(w http.ResponseWriter, r *http.Request) {
	st, ok := s.images(w)
	if !ok {
		return
	}
	var req ImportRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := s.context(r)
	defer cancel()
	im, err := st.Import(ctx, path.Clean(req.Path), req.Name)
	if err != nil {
		writeError(w, &Error{Code: "bad_request", Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, im)
}

func (s *Server) imageRemove(w http.ResponseWriter, r *http.Request) {
	st, ok := s.images(w)
	if !ok {
		return
	}
	ref := r.PathValue("ref")
	if err := checkRef("ref", ref); err != nil {
		writeError(w, err)
		return
	}
	im, err := st.Get(ref)
	if err != nil {
		writeError(w, err)
		return
	}
	// Only the name goes when the image keeps another.
	onlyName := len(im.Names) > 1 && (contains(im.Names, ref) || contains(im.Names, canonicalOf(ref, im)))
	if !onlyName {
		if users := s.imageUsers(im.Digest); len(users) > 0 {
			writeError(w, &Error{Code: "conflict", Message: fmt.Sprintf("image %s is the OS layer of sandbox %s: remove %s first (tine rm)",
				ref, strings.Join(users, ", "), map[bool]string{true: "it", false: "them"}[len(users) == 1])})
			return
		}
	}
	if _, err := st.Remove(ref); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, &RemoveImageResponse{Digest: im.Digest, Removed: !onlyName})
}

// canonicalOf is the name of im that ref stands for, if any, by Get's rules.
func canonicalOf(ref string, im *oci.Image) string {
	for _, n := range im.Names {
		if n == ref {
			return n
		}
	}
	if c := oci.Canonical(ref); c != "" {
		return c
	}
	return ref
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// imageUsers names the sandboxes whose OS layer is the image digest.
func (s *Server) imageUsers(digest string) []string {
	infos, _ := s.m.List()
	var out []string
	for _, in := range infos {
		if in.Image != nil && in.Image.Digest == digest {
			out = append(out, in.Name)
		}
	}
	sort.Strings(out)
	return out
}

// createImage fills o's image from req: the image named in the store,
// its user resolved in the image's /etc/passwd.
func (s *Server) createImage(req *CreateRequest, o *sandbox.CreateOptions) error {
	if req.Image == "" {
		if req.ImageWorkdir != "" {
			return badRequest("field \"image_workdir\" is given without \"image\"")
		}
		return nil
	}
	if !isDir(req.From) {
		return badRequest("field \"image\" is given with a snapshot in \"from\": a snapshot keeps its own image")
	}
	if s.o.Images == nil {
		return &Error{Code: "not_implemented", Message: "this daemon keeps no images (it was started without an image store)"}
	}
	im, err := s.o.Images.Get(req.Image)
	if err != nil {
		return err
	}
	uid, gid, err := oci.ResolveUser(im.Rootfs, im.Config.User)
	if err != nil {
		return badRequest("image %s: %v", req.Image, err)
	}
	si := &sandbox.Image{Ref: req.Image, Digest: im.Digest, Rootfs: im.Rootfs, User: im.Config.User, Workdir: req.ImageWorkdir}
	if im.Config.User != "" {
		si.UID, si.GID = &uid, &gid
	}
	o.Image, o.ImageEnv = si, im.Config.Env
	return nil
}
