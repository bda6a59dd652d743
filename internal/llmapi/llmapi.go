// Package llmapi builds responses shaped like those of LLM APIs, for tests and
// benchmarks of response-based cost: a chat completion reporting the tokens it used in a
// header, in the usage object of a JSON body (OpenAI's and most others' shape), or in the
// last event of a server-sent event stream (OpenAI's stream_options.include_usage).
package llmapi

import (
	"strconv"
	"strings"
)

// Formats are the ways a response can report its tokens.
var Formats = []string{"header", "json", "sse"}

// TokensHeader is the header the "header" format reports tokens in.
const TokensHeader = "x-tokens-used"

// Response returns the headers and body of a completion that used tokens, in format,
// with about contentBytes of generated text (streamed as events of 64 bytes for "sse").
func Response(format string, tokens int64, contentBytes int) (headers [][2]string, body []byte) {
	text := strings.Repeat("lorem ipsum ", contentBytes/12+1)[:contentBytes]
	prompt := min(tokens, 12)
	usage := `{"prompt_tokens":` + itoa(prompt) + `,"completion_tokens":` + itoa(tokens-prompt) + `,"total_tokens":` + itoa(tokens) + `}`
	switch format {
	case "sse":
		var b strings.Builder
		for len(text) > 0 {
			n := min(64, len(text))
			b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":` + strconv.Quote(text[:n]) + `}}],"usage":null}` + "\n\n")
			text = text[n:]
		}
		b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":` + usage + "}\n\n")
		b.WriteString("data: [DONE]\n\n")
		return [][2]string{{"content-type", "text/event-stream"}}, []byte(b.String())
	case "header":
		headers = [][2]string{{"content-type", "application/json"}, {TokensHeader, itoa(tokens)}}
	default:
		headers = [][2]string{{"content-type", "application/json"}}
	}
	body = []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":` +
		strconv.Quote(text) + `},"finish_reason":"stop"}],"usage":` + usage + `}`)
	return headers, body
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
