package main

import (
	"embed"
	"fmt"
	"io"
	"strconv"
	"text/template"
	"time"
)

// The report's prose lives in templates/, one file per section, each rendering a view:
// a struct whose fields are the section's numbers, computed once from the measurements
// (ratios, shares, met or missed) before any text is written. A template only places
// them (range and if, no arithmetic) through the formatters of templateFuncs, so a
// sentence can change without reading the code that measures, and a number without
// reading the prose.

//go:embed templates/*.tmpl
var templateFS embed.FS

// templateFuncs are the number formatters every section's template uses, one copy.
var templateFuncs = template.FuncMap{
	// int is a whole number with thousands separators: 12,345.
	"int": func(v any) string { return fmtInt(num(v)) },
	// f is a number with prec decimals: {{f 2 .X}} is 1.50.
	"f": func(prec int, v any) string { return fmtF(num(v), prec) },
	// dur is a duration in the unit that suits it: 850.0 µs, 1.50 ms, 2.00 s.
	"dur": fmtDur,
	// g is a number in the fewest digits that give it exactly: 0.05, 5000.
	"g": func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) },
	// sdur is a duration with its sign: +1.50 ms, −850.0 µs.
	"sdur": fmtSignedDur,
	// times is a ratio as a multiple or a fraction: 2.0×, 1/100.
	"times": fmtRatio,
	// pct and spct are a fraction as a percentage, spct with its sign: 12 %, +1.5 %.
	"pct":  func(prec int, frac float64) string { return fmt.Sprintf("%.*f %%", prec, 100*frac) },
	"spct": func(prec int, frac float64) string { return fmt.Sprintf("%+.*f %%", prec, 100*frac) },
	// met is a target's verdict: **met** or **missed**.
	"met": yesNo,
	// spread is the min–max of a module's rounds (ns per request).
	"spread": spread,
	// hostCalls lists host calls per request by name.
	"hostCalls": hostCalls,
}

var sectionTemplates = template.Must(template.New("").Funcs(templateFuncs).ParseFS(templateFS, "templates/*.tmpl"))

// render writes the template name with view: a section's file (templates/<name>.tmpl)
// or a template one of them defines.
func render(w io.Writer, name string, view any) error {
	t := sectionTemplates.Lookup(name)
	if t == nil {
		t = sectionTemplates.Lookup(name + ".tmpl")
	}
	if t == nil {
		return fmt.Errorf("no template %q", name)
	}
	if err := t.Execute(w, view); err != nil {
		return fmt.Errorf("section %s: %w", name, err)
	}
	return nil
}

// num is a measured number of any of the kinds the views hold, as a float.
func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case time.Duration:
		return float64(x)
	}
	// A template's mistake: text/template turns the panic into Execute's error, which
	// TestGolden reports.
	panic(fmt.Sprintf("template number of type %T", v))
}
