package respcost

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/llmapi"
)

func TestParseCost(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1234", 1234, true}, {" 42 ", 42, true}, {"1000000", MaxCost, true},
		{"99999999999999999999999", MaxCost, true},
		{"", 0, false}, {"-1", 0, false}, {"1.5", 0, false}, {"12a", 0, false}, {"0x10", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseCost([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseCost(%q) = %d %v, want %d %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// feed writes body to a reset scanner in chunks of n bytes and returns its result.
func feed(s *Scanner, path string, max int, sse bool, body string, n int) (int64, bool) {
	s.Reset(path, max, sse)
	for len(body) > 0 {
		k := min(n, len(body))
		s.Write([]byte(body[:k]))
		body = body[k:]
	}
	return s.Result()
}

func TestScannerJSON(t *testing.T) {
	big := `{"id":"x","choices":[{"text":"` + strings.Repeat("lorem ipsum ", 100_000) + `"}],"usage":{"prompt_tokens":10,"total_tokens":1234}}`
	quoted := `{"choices":[{"text":"\"usage\": {\"total_tokens\": 99} ` + strings.Repeat("x", 5000) + `"}],"usage":{"total_tokens":7}}`
	tests := []struct {
		name, path, body string
		max              int
		want             int64
		ok               bool
	}{
		{"openai", "usage.total_tokens", `{"id":"c","usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, 1024, 12, true},
		{"nested index", "data.1.rows", `{"data":[{"rows":1},{"rows":40}]}`, 1024, 40, true},
		{"missing", "usage.total_tokens", `{"id":"c"}`, 1024, 0, false},
		{"string value", "usage.total_tokens", `{"usage":{"total_tokens":"12"}}`, 1024, 0, false},
		{"negative", "usage.total_tokens", `{"usage":{"total_tokens":-3}}`, 1024, 0, false},
		{"fraction", "usage.total_tokens", `{"usage":{"total_tokens":1.5}}`, 1024, 0, false},
		{"not json", "usage.total_tokens", `<html>oops</html>`, 1024, 0, false},
		{"huge body, usage at the end", "usage.total_tokens", big, 4096, 1234, true},
		{"huge body, quoted key in text", "usage.total_tokens", quoted, 1024, 7, true},
		{"huge body without usage", "usage.total_tokens", `{"t":"` + strings.Repeat("y", 10000) + `"}`, 1024, 0, false},
		{"huge body, usage at the start", "usage.total_tokens", `{"usage":{"total_tokens":5},"t":"` + strings.Repeat("y", 10000) + `"}`, 1024, 0, false},
	}
	for _, tt := range tests {
		var s Scanner // reused across chunk sizes, as a worker reuses it across responses
		for _, n := range []int{1, 7, 1000, 1 << 20} {
			t.Run(tt.name+"/chunk"+strconv.Itoa(n), func(t *testing.T) {
				got, ok := feed(&s, tt.path, tt.max, false, tt.body, n)
				if got != tt.want || ok != tt.ok {
					t.Errorf("got %d %v, want %d %v", got, ok, tt.want, tt.ok)
				}
				if cap(s.buf) > 3*tt.max {
					t.Errorf("buffer grew to %d bytes for a cap of %d", cap(s.buf), tt.max)
				}
			})
		}
	}
}

func TestScannerSSE(t *testing.T) {
	openai := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n" +
		"data: [DONE]\n\n"
	anthropic := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hello\"}}\n\n" +
		": keep-alive comment\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	long := "data: {\"usage\":{\"total_tokens\":3}}\n\n" + "data: {\"pad\":\"" + strings.Repeat("z", 5000) + "\",\"usage\":{\"total_tokens\":999}}\n\n"
	tests := []struct {
		name, path, body string
		want             int64
		ok               bool
	}{
		{"openai include_usage", "usage.total_tokens", openai, 11, true},
		{"openai crlf", "usage.total_tokens", strings.ReplaceAll(openai, "\n", "\r\n"), 11, true},
		{"openai cr", "usage.total_tokens", strings.ReplaceAll(openai, "\n", "\r"), 11, true},
		{"anthropic last delta", "usage.output_tokens", anthropic, 15, true},
		{"no trailing blank line", "usage.total_tokens", "data: {\"usage\":{\"total_tokens\":4}}", 4, true},
		{"multi-line data", "usage.total_tokens", "data: {\"usage\":\ndata: {\"total_tokens\":6}}\n\n", 6, true},
		{"never reported", "usage.total_tokens", "data: {\"a\":1}\n\ndata: [DONE]\n\n", 0, false},
		{"last event malformed", "usage.total_tokens", "data: {\"usage\":{\"total_tokens\":4}}\n\ndata: {\"usage\":{\"total_tokens\":\"x\"}}\n\n", 0, false},
		{"event longer than the cap skipped", "usage.total_tokens", long, 3, true},
	}
	var s Scanner
	for _, tt := range tests {
		for _, n := range []int{1, 2, 5, 64, 1 << 20} {
			t.Run(tt.name+"/chunk"+strconv.Itoa(n), func(t *testing.T) {
				got, ok := feed(&s, tt.path, 1024, true, tt.body, n)
				if got != tt.want || ok != tt.ok {
					t.Errorf("got %d %v, want %d %v", got, ok, tt.want, tt.ok)
				}
				if cap(s.buf) > 2048 || cap(s.data) > 2048 {
					t.Errorf("buffers grew to %d and %d bytes for a cap of 1024", cap(s.buf), cap(s.data))
				}
			})
		}
	}
}

// BenchmarkScanner is the cost of following a response body of about 1 MB for its cost
// (bytes/s in the report), per format.
func BenchmarkScanner(b *testing.B) {
	for _, format := range []string{"json", "sse"} {
		b.Run(format, func(b *testing.B) {
			_, body := llmapi.Response(format, 1234, 1<<20)
			var s Scanner
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				s.Reset("usage.total_tokens", 64<<10, format == "sse")
				for off := 0; off < len(body); off += 16 << 10 {
					s.Write(body[off:min(off+16<<10, len(body))])
				}
				if n, ok := s.Result(); !ok || n != 1234 {
					b.Fatalf("got %d %v", n, ok)
				}
			}
		})
	}
}
