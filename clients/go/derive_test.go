package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"

	"idempotency/clients/go/idem"
)

// clients/vectors.json: the key and fingerprint vectors every client library (and the SQL functions)
// must agree on.
type vectors struct {
	Keys []struct {
		Namespace string   `json:"namespace"`
		Parts     []string `json:"parts"`
		Key       string   `json:"key"`
	} `json:"keys"`
	Fingerprints []struct {
		Document    json.RawMessage `json:"document"` // the document's text as written in the file
		Paths       []string        `json:"paths"`
		Fingerprint string          `json:"fingerprint"`
	} `json:"fingerprints"`
	// Documents of Nest arrays (Kind "array") or objects {"a": ...} ("object") around 1, refused with SQLState.
	Refused []struct {
		Nest     int      `json:"nest"`
		Kind     string   `json:"kind"`
		Paths    []string `json:"paths"`
		SQLState string   `json:"sqlstate"`
	} `json:"refused"`
}

// nested is the document of a refused vector, as JSON text.
func nested(n int, kind string) []byte {
	if kind == "array" {
		return []byte(strings.Repeat("[", n) + "1" + strings.Repeat("]", n))
	}
	return []byte(strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n))
}

func TestDeepDocumentsAreRefusedWith54000(t *testing.T) {
	v := loadVectors(t)
	if len(v.Refused) < 4 {
		t.Fatal("clients/vectors.json has no refused vectors")
	}
	for i, r := range v.Refused {
		_, err := idem.Fingerprint(nested(r.Nest, r.Kind), r.Paths...)
		var deep *idem.DocumentTooDeepError
		if !errors.As(err, &deep) || !errors.Is(err, idem.ErrDocumentTooDeep) || deep.SQLState() != r.SQLState {
			t.Errorf("refused[%d] (%d %s deep): got %v, want SQLSTATE %s", i, r.Nest, r.Kind, err, r.SQLState)
		}
	}
	if fp, err := idem.Fingerprint(nested(idem.MaxDepth, "array")); err != nil || len(fp) != 64 {
		t.Errorf("a document %d deep: %s %v", idem.MaxDepth, fp, err)
	}
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	path := "../vectors.json"
	if p := os.Getenv("IDEM_VECTORS"); p != "" { // another copy of the vectors, e.g. the SQL side's
		path = p
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Keys) == 0 || len(v.Fingerprints) == 0 {
		t.Fatal("clients/vectors.json has no vectors")
	}
	return v
}

func TestKeyVectors(t *testing.T) {
	v := loadVectors(t)
	for i, k := range v.Keys {
		got, err := idem.Key(uuid.MustParse(k.Namespace), k.Parts...)
		if err != nil || got != k.Key {
			t.Errorf("keys[%d] %q: got %s (%v), want %s", i, k.Parts, got, err, k.Key)
		}
	}
	t.Logf("%d key vectors", len(v.Keys))
}

func TestFingerprintVectors(t *testing.T) {
	v := loadVectors(t)
	for i, f := range v.Fingerprints {
		got, err := idem.Fingerprint(f.Document, f.Paths...)
		if err != nil || got != f.Fingerprint {
			c, _ := idem.Canonicalize(f.Document)
			t.Errorf("fingerprints[%d] %s %q: got %s (%v), want %s; canonical %s", i, f.Document, f.Paths, got, err, f.Fingerprint, c)
		}
	}
	t.Logf("%d fingerprint vectors", len(v.Fingerprints))
}

func TestKeyBasics(t *testing.T) {
	ns := uuid.MustParse("6ba7b811-9dad-11d1-80b4-00c04fd430c8") // RFC 4122's URL namespace
	// the name bytes of ["orders", "42"] are "6:orders;2:42;": a plain UUID v5 of that name
	want := uuid.NewSHA1(ns, []byte("6:orders;2:42;")).String()
	if got, _ := idem.Key(ns, "orders", "42"); got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	a, _ := idem.Key(ns, "a;b")
	b, _ := idem.Key(ns, "a", "b")
	if a == b {
		t.Fatal("parts are not length-prefixed")
	}
	if _, err := idem.Key(ns); !errors.Is(err, idem.ErrInvalidDerivation) {
		t.Fatalf("no parts: %v", err)
	}
}

func TestCanonicalize(t *testing.T) {
	cases := []struct{ in, want string }{
		// RFC 8785 3.2.3 ordering: by UTF-16 code units (U+1F600 is D83D DE00, before U+FB33)
		{`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		// strings: only '"', '\\' and controls are escaped; '/' and non-ASCII stay literal
		{`"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"`, "\"\u20ac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\""},
		{`{"b":[1, 2.50, {"z":null,"y":true}], "a":"x"}`, `{"a":"x","b":[1,2.5,{"y":true,"z":null}]}`},
		{`[1E30, 4.50, 2e-3, 0.000000000000000000000000001, -0, 333333333.33333329, 1e21, 1e20, 1e-7, 1e-6]`,
			`[1e+30,4.5,0.002,1e-27,0,333333333.3333333,1e+21,100000000000000000000,1e-7,0.000001]`},
		{`[9007199254740993, 5e-324, 1.7976931348623157e308, -1.5, 123e-20]`,
			`[9007199254740992,5e-324,1.7976931348623157e+308,-1.5,1.23e-18]`},
	}
	for _, c := range cases {
		got, err := idem.Canonicalize([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("Canonicalize(%s) = %s (%v), want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{`{`, `1 2`, `[1e400]`, ``} {
		if _, err := idem.Canonicalize([]byte(bad)); !errors.Is(err, idem.ErrInvalidDerivation) {
			t.Errorf("Canonicalize(%q): want ErrInvalidDerivation, got %v", bad, err)
		}
	}
	if _, err := idem.FormatNumber(math.NaN()); err == nil {
		t.Error("NaN formatted")
	}
}

func TestFingerprintPaths(t *testing.T) {
	doc := []byte(`{"order": {"id": 1, "amount": 19.9, "note": "x"}, "items": [{"sku": "a"}]}`)
	sel, _ := idem.Fingerprint(doc, "/order/id", "/order/amount")
	reordered, _ := idem.Fingerprint([]byte(`{"items": [], "order": {"note": "y", "amount": 19.90, "id": 1}}`), "/order/amount", "/order/id")
	if sel != reordered {
		t.Fatal("the selected paths' fingerprint depends on other fields or on the order of paths")
	}
	whole, _ := idem.Fingerprint(doc)
	root, _ := idem.Fingerprint(doc, "")
	if whole == root {
		t.Fatal(`path "" must map "" to the document, not be the document itself`)
	}
	if _, err := idem.Fingerprint(doc, "order"); !errors.Is(err, idem.ErrInvalidDerivation) {
		t.Fatalf("a path without '/': %v", err)
	}
}

// The SQL functions of the extension (0.3.0 on) against the vectors. An extension without them fails:
// the client's derivations must be checked against the database's.
func TestVectorsAgainstSQL(t *testing.T) {
	ctx := context.Background()
	var have bool
	if err := pool.QueryRow(ctx, `SELECT to_regprocedure('idem_key(uuid, text[])') IS NOT NULL
	                                  AND to_regprocedure('idem_fingerprint(jsonb, text[])') IS NOT NULL`).Scan(&have); err != nil {
		t.Fatal(err)
	}
	if !have {
		t.Fatal("the installed extension has no idem_key(uuid, text[]) / idem_fingerprint(jsonb, text[]) (0.3.0 on): the vectors cannot be checked against SQL")
	}
	v := loadVectors(t)
	for i, k := range v.Keys {
		var got string
		if err := pool.QueryRow(ctx, `SELECT idem_key($1::uuid, VARIADIC $2::text[])`, k.Namespace, k.Parts).Scan(&got); err != nil || got != k.Key {
			t.Errorf("SQL keys[%d]: %s (%v), want %s", i, got, err, k.Key)
		}
	}
	for i, f := range v.Fingerprints {
		paths := f.Paths
		if paths == nil {
			paths = []string{}
		}
		var got string
		if err := pool.QueryRow(ctx, `SELECT idem_fingerprint($1::jsonb, VARIADIC $2::text[])`, string(f.Document), paths).Scan(&got); err != nil || got != f.Fingerprint {
			t.Errorf("SQL fingerprints[%d] %s %q: %s (%v), want %s", i, f.Document, f.Paths, got, err, f.Fingerprint)
		}
	}
}
