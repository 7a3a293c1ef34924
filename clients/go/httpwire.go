package idem

// What the HTTP middleware (HTTP, http.go) does without a server: the Idempotency-Key field as an RFC 8941
// sf-string, routes by method and path, the default request fingerprint, the stored form of a response,
// and the RFC 9457 problem documents it answers with. The same contract as clients/python and clients/node
// (clients/http-vectors.json; docs/http.md).

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// MaxKeyLength is the default longest key, in characters (printable ASCII), as Stripe's.
const MaxKeyLength = 255

// KeyFieldError says why an Idempotency-Key field is not one sf-string of 1 to MaxKeyLength characters.
type KeyFieldError struct{ Reason string }

func (e *KeyFieldError) Error() string { return "idem: " + e.Reason }

func keyErr(reason string) error { return &KeyFieldError{Reason: reason} }

// sfString reads the sf-string starting at s[i] (a '"') and returns it and the index after it.
func sfString(s string, i int) (string, int, error) {
	var b strings.Builder
	for i++; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", 0, keyErr(`a backslash must escape '"' or '\'`)
			}
			i++
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), i + 1, nil
		case c < ' ' || c > '~':
			return "", 0, keyErr("a string holds printable ASCII characters only")
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, keyErr(`the string has no closing '"'`)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// skipBareItem skips the bare item of a parameter value at s[i] and returns the index after it.
func skipBareItem(s string, i int) (int, error) {
	if i >= len(s) {
		return 0, keyErr("a parameter without its value")
	}
	switch c := s[i]; {
	case c == '"':
		_, j, err := sfString(s, i)
		return j, err
	case c == '?':
		if i+1 >= len(s) || (s[i+1] != '0' && s[i+1] != '1') {
			return 0, keyErr("a boolean is ?0 or ?1")
		}
		return i + 2, nil
	case c == ':':
		j := i + 1
		for j < len(s) && (isAlpha(s[j]) || isDigit(s[j]) || strings.IndexByte("+/=", s[j]) >= 0) {
			j++
		}
		if j >= len(s) || s[j] != ':' {
			return 0, keyErr("a byte sequence is base64 between two ':'")
		}
		return j + 1, nil
	case c == '-' || isDigit(c):
		j := i
		if c == '-' {
			j++
		}
		start := j
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		whole := j - start
		if whole == 0 {
			return 0, keyErr("a number needs a digit")
		}
		if j < len(s) && s[j] == '.' {
			j++
			fstart := j
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			if whole > 12 || j-fstart < 1 || j-fstart > 3 {
				return 0, keyErr("a decimal has 1 to 12 digits, '.', and 1 to 3 digits")
			}
		} else if whole > 15 {
			return 0, keyErr("an integer has at most 15 digits")
		}
		return j, nil
	case isAlpha(c) || c == '*':
		j := i + 1
		for j < len(s) && (isAlpha(s[j]) || isDigit(s[j]) || strings.IndexByte("!#$%&'*+-.^_`|~:/", s[j]) >= 0) {
			j++
		}
		return j, nil
	}
	return 0, keyErr("a parameter value must be a string, number, token, byte sequence or boolean")
}

// ParseKey returns the key of an Idempotency-Key field value: an RFC 8941 Item whose bare item is a
// String (its parameters are parsed and ignored), not empty, at most maxLength characters (0 means
// MaxKeyLength). A *KeyFieldError otherwise.
func ParseKey(field string, maxLength int) (string, error) {
	if maxLength <= 0 {
		maxLength = MaxKeyLength
	}
	s := field
	i := 0
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i >= len(s) || s[i] != '"' {
		return "", keyErr("Idempotency-Key must be a quoted string (RFC 8941 sf-string)")
	}
	key, i, err := sfString(s, i)
	if err != nil {
		return "", err
	}
	for i < len(s) && s[i] == ';' {
		i++
		for i < len(s) && s[i] == ' ' {
			i++
		}
		if i >= len(s) || !(s[i] >= 'a' && s[i] <= 'z' || s[i] == '*') {
			return "", keyErr("a parameter key starts with a lowercase letter or '*'")
		}
		for i++; i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || isDigit(s[i]) || strings.IndexByte("_-.*", s[i]) >= 0); i++ {
		}
		if i < len(s) && s[i] == '=' {
			if i, err = skipBareItem(s, i+1); err != nil {
				return "", err
			}
		}
	}
	for i < len(s) && s[i] == ' ' {
		i++
	}
	switch {
	case i != len(s):
		return "", keyErr("Idempotency-Key must be a single string")
	case key == "":
		return "", keyErr("Idempotency-Key is empty")
	case len(key) > maxLength:
		return "", keyErr(fmt.Sprintf("Idempotency-Key is longer than %d characters", maxLength))
	}
	return key, nil
}

// PathMatches reports whether path matches pattern: a segment "*" matches one non-empty segment, a last
// segment "**" matches any rest (none included), any other segment itself.
func PathMatches(pattern, path string) bool {
	want, have := strings.Split(pattern, "/"), strings.Split(path, "/")
	for n, seg := range want {
		if seg == "**" && n == len(want)-1 {
			return true
		}
		if n >= len(have) || !(seg == have[n] || seg == "*" && have[n] != "") {
			return false
		}
	}
	return len(want) == len(have)
}

// RequestFingerprint is the default request fingerprint: hex SHA-256 of the method, LF, the request
// target as received (path and query: http.Request.RequestURI), LF, and the body.
func RequestFingerprint(method, target string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method + "\n" + target + "\n"))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// StoredResponse is the JSON document stored for a response: its status, the kept headers (lowercased
// names, each value), and the body as text when it is UTF-8 without NUL (jsonb cannot hold one), else
// as base64.
type StoredResponse struct {
	Status     int         `json:"status"`
	Headers    [][2]string `json:"headers"`
	Body       *string     `json:"body,omitempty"`
	BodyBase64 *string     `json:"body_base64,omitempty"`
}

// NewStoredResponse keeps the headers named in keep (any case), in keep's order.
func NewStoredResponse(status int, header http.Header, body []byte, keep []string) StoredResponse {
	sr := StoredResponse{Status: status, Headers: [][2]string{}}
	for _, name := range keep {
		for _, v := range header.Values(name) {
			sr.Headers = append(sr.Headers, [2]string{strings.ToLower(name), v})
		}
	}
	if utf8.Valid(body) && strings.IndexByte(string(body), 0) < 0 {
		text := string(body)
		sr.Body = &text
	} else {
		b64 := base64.StdEncoding.EncodeToString(body)
		sr.BodyBase64 = &b64
	}
	return sr
}

// Replay is the stored response's status, headers (with Idempotent-Replayed: true) and body.
func (sr StoredResponse) Replay() (int, http.Header, []byte, error) {
	h := http.Header{}
	for _, kv := range sr.Headers {
		h.Add(kv[0], kv[1])
	}
	h.Set("Idempotent-Replayed", "true")
	switch {
	case sr.Body != nil:
		return sr.Status, h, []byte(*sr.Body), nil
	case sr.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*sr.BodyBase64)
		return sr.Status, h, b, err
	}
	return sr.Status, h, nil, nil
}

// The problems the middleware answers with: code -> status, title, detail.
var problems = map[string]struct {
	status        int
	title, detail string
}{
	"idempotency-key-missing": {400, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header."},
	"idempotency-key-invalid": {400, "Idempotency-Key is invalid", ""},
	"idempotency-key-in-use": {409, "A request is outstanding for this Idempotency-Key",
		"A request with the same Idempotency-Key is being processed; retry later."},
	"idempotency-key-reused": {422, "Idempotency-Key is already used",
		"This Idempotency-Key was used with a different request; use a new key."},
	"request-too-large": {413, "Request body too large", ""},
	"idempotency-lease-lost": {409, "The request's lease was lost",
		"Another attempt took this Idempotency-Key over; retry to read its outcome."},
	"idempotency-key-failed": {500, "Idempotency-Key failed",
		"Every attempt of this request failed; send it again with a new Idempotency-Key."},
}

var phrases = map[int]string{400: "Bad Request", 409: "Conflict", 413: "Content Too Large",
	422: "Unprocessable Content", 500: "Internal Server Error"}

// Problem is the RFC 9457 document of a problem code: type base+code and the case's title, or, without a
// base, about:blank and the status phrase; a "code" member names the case either way.
func Problem(code, base, detail string) (int, []byte) {
	p, ok := problems[code]
	if !ok {
		panic("idem: unknown problem " + code)
	}
	doc := map[string]interface{}{"type": "about:blank", "title": phrases[p.status], "status": p.status,
		"code": code}
	if base != "" {
		doc["type"], doc["title"] = base+code, p.title
	}
	switch {
	case detail != "":
		doc["detail"] = detail
	case p.detail != "":
		doc["detail"] = p.detail
	default:
		doc["detail"] = p.title
	}
	b, _ := json.Marshal(doc)
	return p.status, b
}
