package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/google/uuid"
)

// ErrInvalidDerivation: Key without parts, or Fingerprint with a path that is not a JSON Pointer, or a
// document that is not JSON (or has a number JSON canonicalization cannot represent). The SQL
// functions raise 22023 (22004 for a NULL part) in the same cases.
var ErrInvalidDerivation = errors.New("idem: invalid key or fingerprint input")

// Key derives an idempotency key from the parts that identify an event, as the extension's
// idem_key(namespace, VARIADIC parts) does: the RFC 4122 version-5 (SHA-1) UUID of namespace and the
// name "len(part):part;" for each part in order (lengths in UTF-8 bytes), as lowercase hyphenated text.
// Length prefixes keep ("a;b") and ("a", "b") apart. At least one part is required.
func Key(namespace uuid.UUID, parts ...string) (string, error) {
	if len(parts) == 0 {
		return "", fmt.Errorf("%w: Key needs at least one part", ErrInvalidDerivation)
	}
	return uuid.NewSHA1(namespace, keyName(parts)).String(), nil
}

func keyName(parts []string) []byte {
	var b bytes.Buffer
	for _, p := range parts {
		b.WriteString(strconv.Itoa(len(p)))
		b.WriteByte(':')
		b.WriteString(p)
		b.WriteByte(';')
	}
	return b.Bytes()
}

// Fingerprint computes a request fingerprint of a JSON document, as the extension's
// idem_fingerprint(document, VARIADIC paths) does: the lowercase hex SHA-256 of the RFC 8785 (JCS)
// canonical JSON of the whole document (no paths), or of the object that maps each path, exactly as
// given, to the value at that RFC 6901 JSON Pointer ("" is the whole document, "/items/0/sku"), JSON
// null where there is none. Numbers are IEEE doubles, as in JCS: integers beyond 2^53 lose precision.
//
// A document whose arrays and objects nest deeper than MaxDepth is refused with a *DocumentTooDeepError
// (SQLSTATE 54000, as the SQL function), before it is parsed.
func Fingerprint(document []byte, paths ...string) (string, error) {
	v, err := parseJSON(document)
	if err != nil {
		return "", err
	}
	return fingerprintValue(v, paths)
}

// FingerprintOf is Fingerprint of json.Marshal(v).
func FingerprintOf(v interface{}, paths ...string) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidDerivation, err)
	}
	return Fingerprint(b, paths...)
}

func fingerprintValue(v interface{}, paths []string) (string, error) {
	if len(paths) > 0 {
		selected := make(map[string]interface{}, len(paths))
		for _, p := range paths {
			val, err := pointer(v, p)
			if err != nil {
				return "", err
			}
			selected[p] = val
		}
		v = selected
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return "", err
	}
	sum := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// Canonicalize returns the RFC 8785 (JCS) canonical form of a JSON document.
func Canonicalize(document []byte) ([]byte, error) {
	v, err := parseJSON(document)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// MaxDepth is the deepest nesting of arrays and objects a fingerprinted document may have (a scalar is 0
// deep, [] 1): the extension's idem_fingerprint and every client library refuse deeper ones with 54000.
const MaxDepth = 100

// ErrDocumentTooDeep: a document nests arrays and objects deeper than MaxDepth. Concrete type:
// *DocumentTooDeepError.
var ErrDocumentTooDeep = errors.New("idem: document nested too deep")

// DocumentTooDeepError is a document refused by Fingerprint or Canonicalize for its depth.
type DocumentTooDeepError struct {
	Depth int
}

func (e *DocumentTooDeepError) Error() string {
	return fmt.Sprintf("idem: document nests %d arrays and objects deep, over the limit of %d", e.Depth, MaxDepth)
}

// SQLState is what idem_fingerprint raises for the same document: 54000 (program_limit_exceeded).
func (e *DocumentTooDeepError) SQLState() string { return "54000" }

// Is matches ErrDocumentTooDeep.
func (e *DocumentTooDeepError) Is(target error) bool { return target == ErrDocumentTooDeep }

// jsonDepth is how deeply arrays and objects nest in a JSON text, counted in one pass without recursion.
func jsonDepth(document []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, c := range document {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			if depth > deepest {
				deepest = depth
			}
		case ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return deepest
}

func parseJSON(document []byte) (interface{}, error) {
	if d := jsonDepth(document); d > MaxDepth {
		return nil, &DocumentTooDeepError{Depth: d}
	}
	dec := json.NewDecoder(bytes.NewReader(document))
	dec.UseNumber()
	var v interface{}
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: not a JSON document: %v", ErrInvalidDerivation, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: not a JSON document: data after the first value", ErrInvalidDerivation)
	}
	return v, nil
}

var arrayIndex = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

// pointer evaluates an RFC 6901 JSON Pointer; nil (JSON null) when there is no value there.
func pointer(v interface{}, p string) (interface{}, error) {
	if p == "" {
		return v, nil
	}
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("%w: %q is not a JSON Pointer (it must be empty or start with '/')", ErrInvalidDerivation, p)
	}
	for _, tok := range strings.Split(p[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]interface{}:
			next, ok := x[tok]
			if !ok {
				return nil, nil
			}
			v = next
		case []interface{}:
			if !arrayIndex.MatchString(tok) {
				return nil, nil
			}
			i, err := strconv.Atoi(tok)
			if err != nil || i >= len(x) {
				return nil, nil
			}
			v = x[i]
		default:
			return nil, nil
		}
	}
	return v, nil
}

func writeCanonical(b *bytes.Buffer, v interface{}) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("%w: number %s: %v", ErrInvalidDerivation, x, err)
		}
		s, err := FormatNumber(f)
		if err != nil {
			return fmt.Errorf("%w: number %s: %v", ErrInvalidDerivation, x, err)
		}
		b.WriteString(s)
	case float64:
		s, err := FormatNumber(x)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidDerivation, err)
		}
		b.WriteString(s)
	case string:
		writeString(b, x)
	case []interface{}:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]interface{}:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return lessUTF16(keys[i], keys[j]) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("%w: unexpected JSON value of type %T", ErrInvalidDerivation, v)
	}
	return nil
}

// lessUTF16 orders strings by their UTF-16 code units, as JCS sorts object members.
func lessUTF16(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

// writeString writes a JSON string as JCS does (ECMAScript's JSON.stringify): only '"', '\\' and the
// control characters below U+0020 are escaped, with the short forms where JSON has one.
func writeString(b *bytes.Buffer, s string) {
	const hexdigits = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hexdigits[r>>4])
				b.WriteByte(hexdigits[r&0xf])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// FormatNumber formats a double as ECMAScript's Number.prototype.toString does (the JCS number form):
// the shortest digits that round-trip, plain notation for decimal exponents from -6 to 20, otherwise
// d.ddde±n. NaN and the infinities have no JSON form.
func FormatNumber(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", fmt.Errorf("%v has no JSON representation", f)
	}
	if f == 0 {
		return "0", nil // and -0
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	// shortest round-trip digits d.ddd and exponent e: f = 0.digits * 10^n with n = e + 1
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expText, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	exp, _ := strconv.Atoi(expText)
	k, n := len(digits), exp+1
	var out string
	switch {
	case k <= n && n <= 21:
		out = digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		out = digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		out = "0." + strings.Repeat("0", -n) + digits
	default:
		es := "+"
		if n-1 < 0 {
			es = "-"
		}
		abs := n - 1
		if abs < 0 {
			abs = -abs
		}
		if k == 1 {
			out = digits + "e" + es + strconv.Itoa(abs)
		} else {
			out = digits[:1] + "." + digits[1:] + "e" + es + strconv.Itoa(abs)
		}
	}
	return sign + out, nil
}
