package main

import (
	"embed"
	"fmt"
	"io"
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

// templateFuncs are the number formatters every section's template uses.
var templateFuncs = template.FuncMap{
	"int":       func(v any) string { return fmtInt(num(v)) },                                           // 12,345
	"f":         func(prec int, v any) string { return fmtF(num(v), prec) },                             // fixed decimals
	"dur":       fmtDur,                                                                                 // 1.50 ms
	"times":     fmtRatio,                                                                               // 2.0× or 1/100
	"pct":       func(prec int, frac float64) string { return fmt.Sprintf("%.*f %%", prec, 100*frac) },  // 12 %
	"spct":      func(prec int, frac float64) string { return fmt.Sprintf("%+.*f %%", prec, 100*frac) }, // +1.5 %
	"met":       yesNo,                                                                                  // **met** / **missed**
	"spread":    spread,                                                                                 // min–max of rounds
	"hostCalls": hostCalls,                                                                              // get_header_map_value 1.00, ...
	"cells":     cells,                                                                                  // a table row's cells
}

var sectionTemplates = template.Must(template.New("").Funcs(templateFuncs).ParseFS(templateFS, "templates/*.tmpl"))

// render writes the section template name (templates/<name>.tmpl) with view.
func render(w io.Writer, name string, view any) error {
	if err := sectionTemplates.ExecuteTemplate(w, name+".tmpl", view); err != nil {
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
	panic(fmt.Sprintf("template number of type %T", v)) // a template's mistake, caught by TestGolden
}

// cells is a table row whose cells another part of the report formatted already.
func cells(row []string) string {
	s := ""
	for i, c := range row {
		if i > 0 {
			s += " | "
		}
		s += c
	}
	return s
}
