package api

import (
	"bytes"
	"encoding/base64"
)

// BytesField decodes msg when it is exactly {"KEY":"BASE64"}: the form
// encoding/json gives a message whose one field set is a []byte, which
// is what nearly every message of a busy exec stream is (a chunk of
// output, or of input). It skips encoding/json's two passes over each
// byte, which cost the client more CPU than the command's output did.
// ok is false for any other form, valid or not, which the caller then
// decodes with encoding/json; where ok is true, encoding/json would
// have decoded msg to the same bytes.
func BytesField(msg []byte, key string) (b []byte, ok bool) {
	rest, ok := bytes.CutPrefix(msg, []byte(`{"`))
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(key)); !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`":"`)); !ok {
		return nil, false
	}
	enc, ok := bytes.CutSuffix(rest, []byte(`"}`))
	if !ok || !plainBase64(enc) {
		return nil, false
	}
	b = make([]byte, base64.StdEncoding.DecodedLen(len(enc)))
	n, err := base64.StdEncoding.Decode(b, enc)
	if err != nil {
		return nil, false
	}
	return b[:n], true
}

// plainBase64 says enc holds only the standard base64 alphabet and its
// padding: no escape, quote or line break, which base64 decoding would
// skip or encoding/json would read otherwise.
func plainBase64(enc []byte) bool {
	for _, c := range enc {
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '+', c == '/', c == '=':
		default:
			return false
		}
	}
	return true
}
