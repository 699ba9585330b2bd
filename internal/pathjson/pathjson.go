// Package pathjson carries file paths through JSON exactly. A JSON string
// holds UTF-8 text, but a path is any bytes but NUL, and encoding/json
// turns the bytes that are not UTF-8 into U+FFFD. A path therefore goes
// out as its text ("path") and, when it is not UTF-8, also as base64 of
// its bytes ("path_b64"); a reader takes the bytes when they are there.
package pathjson

import (
	"encoding/base64"
	"unicode/utf8"
)

// B64 is base64 of p's bytes when p is not UTF-8, and "" when it is (the
// JSON string carries it whole).
func B64(p string) string {
	if utf8.ValidString(p) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(p))
}

// Exact is the path that a text form and a B64 form name together: the
// bytes of b64 when it is set and valid base64, else path.
func Exact(path, b64 string) string {
	if b64 == "" {
		return path
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return path
	}
	return string(b)
}
