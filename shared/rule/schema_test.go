package rule

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// acceptedObject is one JSON object the parser reads: the function that reads it and
// the field names its parseObject call allows.
type acceptedObject struct {
	fn     string
	fields []string
}

// acceptedFields finds every parseObject call in the package's non-test sources and
// the field names it allows: its string literals, or those of the slice variable it
// spreads (fields := []string{...}; fields = append(fields, ...)) in the same function.
// The set is read from the parser itself, so a field added there is seen here.
func acceptedFields(t *testing.T) []acceptedObject {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []acceptedObject
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "parseObject" || len(call.Args) < 3 {
					return true
				}
				obj := acceptedObject{fn: fd.Name.Name}
				for _, a := range call.Args[2:] {
					switch a := a.(type) {
					case *ast.BasicLit:
						obj.fields = append(obj.fields, unquote(t, a))
					case *ast.Ident:
						obj.fields = append(obj.fields, sliceLiterals(t, fd, a.Name)...)
					default:
						t.Fatalf("%s: parseObject in %s takes %T: teach acceptedFields to read it", fset.Position(a.Pos()), fd.Name.Name, a)
					}
				}
				out = append(out, obj)
				return true
			})
		}
	}
	if len(out) < 15 {
		t.Fatalf("found %d parseObject calls: has the parser changed how it lists fields?", len(out))
	}
	return out
}

// sliceLiterals returns the string literals assigned or appended to the variable name
// in fn.
func sliceLiterals(t *testing.T, fn *ast.FuncDecl, name string) []string {
	var out []string
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
			return true
		}
		if id, ok := as.Lhs[0].(*ast.Ident); !ok || id.Name != name {
			return true
		}
		ast.Inspect(as.Rhs[0], func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				out = append(out, unquote(t, lit))
			}
			return true
		})
		return true
	})
	if len(out) == 0 {
		t.Fatalf("%s: no string literals assigned to %s", fn.Name.Name, name)
	}
	return out
}

func unquote(t *testing.T, lit *ast.BasicLit) string {
	s, err := strconv.Unquote(lit.Value)
	if lit.Kind != token.STRING || err != nil {
		t.Fatalf("parseObject field %s is not a string literal", lit.Value)
	}
	return s
}

// schemaBlock is where SCHEMA.md's full example documents the object a function reads:
// the example claims every field of these objects (a field it does not use appears in
// a comment, as "windows" and "calendar" of a rule do).
var schemaBlock = map[string]string{
	"Parse":            "@this",
	"parseSync":        "sync",
	"parseTelemetry":   "telemetry",
	"parseRule":        "rules.0",
	"parseMatchBlock":  "rules.0.match",
	"parseDescriptors": "rules.0.descriptors",
}

// schemaMisses returns each accepted field SCHEMA.md does not document: for the
// objects of schemaBlock, the field must be a key of that object in the document's
// first jsonc example (or written as "field": in a comment inside it); for every other
// object, the field must appear in SCHEMA.md as "field" or `field`.
func schemaMisses(schema string, objs []acceptedObject) ([]string, error) {
	const open = "```jsonc\n"
	i := strings.Index(schema, open)
	if i < 0 {
		return nil, errorString("SCHEMA.md has no jsonc example")
	}
	block := schema[i+len(open):]
	block = block[:strings.Index(block, "```")]
	stripped, comments := stripComments(block)
	if !gjson.Valid(stripped) {
		return nil, errorString("SCHEMA.md's jsonc example is not JSON once its comments are removed")
	}
	doc := gjson.Parse(stripped)
	var miss []string
	for _, o := range objs {
		path, full := schemaBlock[o.fn]
		var v gjson.Result
		if full {
			if v = doc.Get(path); !v.IsObject() {
				return nil, errorString("SCHEMA.md's example has no object at " + path + " (read by " + o.fn + ")")
			}
		}
		for _, f := range o.fields {
			var ok bool
			if full {
				// Raw spans the object in stripped, which keeps the block's offsets.
				span := comments[v.Index : v.Index+len(v.Raw)]
				ok = v.Get(gjson.Escape(f)).Exists() || strings.Contains(span, strconv.Quote(f)+":")
			} else {
				ok = strings.Contains(schema, strconv.Quote(f)) || strings.Contains(schema, "`"+f+"`")
			}
			if !ok {
				where := o.fn
				if full {
					where = path
				}
				miss = append(miss, where+": "+f)
			}
		}
	}
	slices.Sort(miss)
	return slices.Compact(miss), nil
}

// stripComments blanks the // comments of a jsonc text (outside strings) with spaces,
// keeping every offset, and returns it with a copy in which only the comments are kept
// (the rest blanked), so a span of one indexes the other.
func stripComments(s string) (code, comments string) {
	c := []byte(s)
	k := []byte(strings.Repeat(" ", len(s)))
	inString, escaped := false, false
	for i := 0; i < len(c); i++ {
		switch {
		case inString:
			inString = escaped || c[i] != '"'
			escaped = !escaped && c[i] == '\\'
		case c[i] == '"':
			inString = true
		case c[i] == '/' && i+1 < len(c) && c[i+1] == '/':
			for ; i < len(c) && c[i] != '\n'; i++ {
				k[i], c[i] = c[i], ' '
			}
		}
	}
	return string(c), string(k)
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestSchemaDocumentsEveryField: every field the parser accepts is documented in
// SCHEMA.md, and the full example names every field of the objects it shows. A copy of
// SCHEMA.md missing a field, and a parser accepting a field SCHEMA.md does not know,
// both fail, so the test can.
func TestSchemaDocumentsEveryField(t *testing.T) {
	b, err := os.ReadFile("SCHEMA.md")
	if err != nil {
		t.Fatal(err)
	}
	schema := string(b)
	objs := acceptedFields(t)
	for fn := range schemaBlock {
		if !slices.ContainsFunc(objs, func(o acceptedObject) bool { return o.fn == fn }) {
			t.Fatalf("schemaBlock names %s, which calls no parseObject", fn)
		}
	}
	without := func(line string) string {
		if !strings.Contains(schema, line) {
			t.Fatalf("%q is not in SCHEMA.md", line)
		}
		return strings.Replace(schema, line, "", 1)
	}
	planted := append(slices.Clone(objs), acceptedObject{fn: "parseSync", fields: []string{"flush_ms"}},
		acceptedObject{fn: "parseKeySource", fields: []string{"cookie"}})
	tests := []struct {
		name   string
		schema string
		objs   []acceptedObject
		want   []string
	}{
		{"shipped", schema, objs, nil},
		{"sync field missing from the example", without(`"stale_ms": 10000,`), objs, []string{"sync: stale_ms"}},
		{"rule field only in a comment elsewhere", without(`"cold_start": "bounded",`), objs, []string{"rules.0: cold_start"}},
		{"parser accepts undocumented fields", schema, planted, []string{"parseKeySource: cookie", "sync: flush_ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			miss, err := schemaMisses(tt.schema, tt.objs)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(miss, tt.want) {
				t.Fatalf("undocumented fields %q, want %q", miss, tt.want)
			}
		})
	}
}
