package spec

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type tarEntry struct {
	name, body, link string
	typ              byte
}

func featureTar(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o755, Typeflag: e.typ, Linkname: e.link}
		if e.typ == 0 {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// testReg is an in-process registry that counts blob fetches and, when
// tamper is set, serves each blob with one byte changed.
type testReg struct {
	host   string
	blobs  atomic.Int32
	tamper atomic.Bool
}

func testRegistry(t *testing.T) *testReg {
	tr := &testReg{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
			reg.ServeHTTP(w, r)
			return
		}
		tr.blobs.Add(1)
		rec := httptest.NewRecorder()
		reg.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if tr.tamper.Load() && len(body) > 0 {
			body[len(body)/2] ^= 1
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	tr.host = strings.TrimPrefix(srv.URL, "http://")
	return tr
}

// pushFeature pushes a feature artifact: one layer of the feature layer
// type holding layer.
func pushFeature(t *testing.T, ref string, layer []byte, mediaType types.MediaType) {
	t.Helper()
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, "application/vnd.devcontainers"), types.OCIManifestSchema1),
		static.NewLayer(layer, mediaType))
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

// TestFetchFeature: an OCI feature is fetched from its registry, unpacked
// with package oci's rules, cached by digest (a second load fetches no
// blob), and made a setup step like a local one; an artifact that is no
// feature, or whose tar leaves its directory, is refused.
func TestFetchFeature(t *testing.T) {
	reg := testRegistry(t)
	host, blobs := reg.host, &reg.blobs
	ref := host + "/features/hello:1"
	pushFeature(t, ref, featureTar(t, []tarEntry{
		{name: "./", typ: tar.TypeDir},
		{name: "./devcontainer-feature.json", body: featureMeta},
		{name: "./install.sh", body: featureInstall},
	}), FeatureLayerType)
	f := &FeatureFetcher{Dir: filepath.Join(t.TempDir(), "features")}
	p := devcontainerDir(t, `{"features": {"`+ref+`": {"greeting": "oci"}}}`)
	s, err := LoadDevcontainer(t.Context(), p, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Setup) != 1 || s.Setup[0].Name != "feature "+ref || !strings.Contains(s.Setup[0].Run, "'GREETING=oci'") || s.Env["HELLO_HOME"] != "/opt/hello" {
		t.Fatalf("setup %+v env %v", s.Setup, s.Env)
	}
	fetched := blobs.Load()
	if fetched == 0 {
		t.Fatalf("no blob fetched")
	}
	s2, err := LoadDevcontainer(t.Context(), p, f)
	if err != nil || blobs.Load() != fetched || !bytes.Equal(s2.Setup[0].Input, s.Setup[0].Input) {
		t.Errorf("second load: %v, blob fetches %d then %d", err, fetched, blobs.Load())
	}
	ents, _ := os.ReadDir(f.Dir)
	if len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), "sha256-") {
		t.Errorf("cache holds %v", ents)
	}

	for _, c := range []struct {
		name  string
		layer []byte
		typ   types.MediaType
		want  string
	}{
		{"escape", featureTar(t, []tarEntry{{name: "../../evil", body: "x"}, {name: "install.sh", body: "true"}}), FeatureLayerType, "evil"},
		{"linkout", featureTar(t, []tarEntry{{name: "devcontainer-feature.json", body: "{}"}, {name: "install.sh", typ: tar.TypeSymlink, link: "/etc/passwd"}}), FeatureLayerType, "install.sh: want a regular file"},
		{"notfeature", featureTar(t, []tarEntry{{name: "install.sh", body: "true"}}), types.DockerLayer, "not a devcontainer feature"},
	} {
		r := host + "/features/" + c.name + ":1"
		pushFeature(t, r, c.layer, c.typ)
		p := devcontainerDir(t, `{"features": {"`+r+`": {}}}`)
		if _, err := LoadDevcontainer(t.Context(), p, f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// A blob that does not match its digest is refused.
	pushFeature(t, host+"/features/tampered:1", featureTar(t, []tarEntry{{name: "devcontainer-feature.json", body: "{}"}, {name: "install.sh", body: "true"}}), FeatureLayerType)
	reg.tamper.Store(true)
	p = devcontainerDir(t, `{"features": {"`+host+`/features/tampered:1": {}}}`)
	if _, err := LoadDevcontainer(t.Context(), p, f); err == nil || !strings.Contains(err.Error(), "verifying sha256") {
		t.Errorf("tampered blob: %v", err)
	}
	reg.tamper.Store(false)
	p = devcontainerDir(t, `{"features": {"`+host+`/features/absent:1": {}}}`)
	if _, err := LoadDevcontainer(t.Context(), p, f); err == nil || !strings.Contains(err.Error(), "fetch "+host+"/features/absent:1") {
		t.Errorf("absent feature: %v", err)
	}
}
