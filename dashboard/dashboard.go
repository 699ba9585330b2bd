// Package dashboard is tine's web dashboard: plain HTML, JavaScript and
// CSS embedded in the binary (no build step), served beside the daemon's
// API on an HTTP address. The page calls the same /v1 API as every other
// client; over TCP the API is reached only with the dashboard's token.
// docs/dashboard.md describes it.
package dashboard

import (
	"crypto/subtle"
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// cookieName holds the token in the browser once the page was opened with
// ?token=.
const cookieName = "tine_dashboard"

// Handler serves the dashboard at /ui/ and the API (api) at /v1/. Every
// request needs token: as "Authorization: Bearer TOKEN", as the cookie the
// handler sets when a page is opened with ?token=TOKEN (HttpOnly,
// SameSite=Strict, so other sites' pages cannot use it), or as that query
// parameter itself.
func Handler(api http.Handler, token string) http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))
	want := []byte(token)
	ok := func(got string) bool { return subtle.ConstantTimeCompare([]byte(got), want) == 1 }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Frame-Options", "DENY")
		authed := false
		if q := r.URL.Query().Get("token"); q != "" && ok(q) {
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			authed = true
		}
		if c, err := r.Cookie(cookieName); err == nil && ok(c.Value) {
			authed = true
		}
		if b, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && ok(b) {
			authed = true
		}
		if !authed {
			http.Error(w, "tine dashboard: open the address tine serve printed (it carries ?token=), or send Authorization: Bearer TOKEN", http.StatusUnauthorized)
			return
		}
		switch {
		case r.URL.Path == "/":
			http.Redirect(w, r, "/ui/", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/ui/"):
			w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
			files.ServeHTTP(w, r)
		case strings.HasPrefix(r.URL.Path, "/v1/"):
			api.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	})
}
