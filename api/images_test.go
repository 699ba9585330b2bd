package api_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
	"tine/api/client"
	"tine/internal/testimage"
	"tine/sandbox"
)

// TestImages: the image routes and create's image over a real daemon.
func TestImages(t *testing.T) {
	// Without a store the routes answer 501.
	rec := httptest.NewRecorder()
	api.NewServer(nil, api.ServerOptions{}).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/images", nil))
	if rec.Code != http.StatusNotImplemented {
		t.Errorf("GET /v1/images without a store: %d %s", rec.Code, rec.Body)
	}

	e := newEnv(t)
	ctx := ctxT(t)
	code := func(err error) string {
		var ce *client.Error
		if errors.As(err, &ce) {
			return ce.Code
		}
		return ""
	}
	if _, err := e.c.ImportImage(ctx, api.ImportRequest{Path: "bb.tar"}); code(err) != "bad_request" {
		t.Errorf("import of a relative path: %v", err)
	}
	tb := filepath.Join(t.TempDir(), "bb.tar")
	testimage.WriteTarball(t, tb, "example.test/bb:1", testimage.BusyboxImage(t))
	im, err := e.c.ImportImage(ctx, api.ImportRequest{Path: tb})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.c.Image(ctx, "example.test/bb:1"); err != nil || got.Digest != im.Digest {
		t.Fatalf("get by a name with slashes: %+v %v", got, err)
	}
	if _, err := e.c.Create(ctx, api.CreateRequest{From: e.project, Image: "nosuch"}); code(err) != "not_found" || !strings.Contains(err.Error(), "tine image pull") {
		t.Errorf("create over an unknown image: %v", err)
	}
	sb, err := e.c.Create(ctx, api.CreateRequest{Name: "img", From: e.project, Image: "example.test/bb:1"})
	if err != nil {
		t.Fatal(err)
	}
	if out := e.sh("img", "cat /only-in-image"); out != "image file\n" {
		t.Errorf("exec over the image: %q", out)
	}
	snap, err := e.c.Snapshot(ctx, sb.Name, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Image == nil || snap.Image.Digest != im.Digest {
		t.Errorf("snapshot's image: %+v", snap.Image)
	}
	if _, err := e.c.Create(ctx, api.CreateRequest{From: snap.ID, Image: "example.test/bb:1"}); code(err) != "bad_request" {
		t.Errorf("image with a snapshot: %v", err)
	}
	if _, err := e.c.RemoveImage(ctx, im.Digest); code(err) != "conflict" || !strings.Contains(err.Error(), "sandbox img") {
		t.Errorf("remove of an image in use: %v", err)
	}
	if err := e.c.Remove(ctx, "img"); err != nil {
		t.Fatal(err)
	}
	if out, err := e.c.RemoveImage(ctx, "example.test/bb:1"); err != nil || !out.Removed {
		t.Fatalf("remove: %+v %v", out, err)
	}
	if _, err := e.c.Image(ctx, im.Digest); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("get after remove: %v", err)
	}
}
