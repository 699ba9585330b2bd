package cowfs

import (
	"encoding/json"

	"tine/internal/pathjson"
)

// pathReasonJSON is the JSON form of a Conflict or a Refusal: a path that
// is not UTF-8 also gets its exact bytes in path_b64 (package pathjson),
// and decoding gives those bytes back.
type pathReasonJSON struct {
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
	Reason  string `json:"reason"`
}

func marshalPathReason(path, reason string) ([]byte, error) {
	return json.Marshal(pathReasonJSON{path, pathjson.B64(path), reason})
}

func unmarshalPathReason(b []byte) (path, reason string, err error) {
	var j pathReasonJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return "", "", err
	}
	return pathjson.Exact(j.Path, j.PathB64), j.Reason, nil
}

// MarshalJSON writes the path's exact bytes in path_b64 when they are not
// UTF-8.
func (c Conflict) MarshalJSON() ([]byte, error) { return marshalPathReason(c.Path, c.Reason) }

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Conflict) UnmarshalJSON(b []byte) (err error) {
	c.Path, c.Reason, err = unmarshalPathReason(b)
	return err
}

// MarshalJSON writes the path's exact bytes in path_b64 when they are not
// UTF-8.
func (r Refusal) MarshalJSON() ([]byte, error) { return marshalPathReason(r.Path, r.Reason) }

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Refusal) UnmarshalJSON(b []byte) (err error) {
	r.Path, r.Reason, err = unmarshalPathReason(b)
	return err
}
