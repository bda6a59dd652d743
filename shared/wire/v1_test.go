package wire

import (
	"errors"
	"reflect"
	"testing"
)

// The service still reads Version 1 batches and answers them in Version 1 (rolling
// upgrades): both codecs must round-trip, and each decoder refuses the other version.
func TestV1RoundTrip(t *testing.T) {
	b := &BatchV1{Node: "gw-old", Worker: 7, Seq: 1 << 40, RulesVersion: 3, Deltas: []DeltaV1{
		{Key: "k1", Rule: "api", Window: 1, Flags: 2, Leased: 4, Over: 5, Returned: 1, Rejected: 2, Early: 1, Algo: 1, Limit: 100, WindowMs: 60000, Burst: 10},
	}}
	enc, err := AppendBatchV1(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	var got BatchV1
	if err := DecodeBatchV1(enc, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, b) {
		t.Fatalf("batch round trip:\n got %+v\nwant %+v", got, *b)
	}
	var v2 Batch
	if err := DecodeBatch(enc, &v2); !errors.Is(err, ErrVersion) {
		t.Fatalf("DecodeBatch(v1) = %v, want ErrVersion", err)
	}
	r := &ReplyV1{RulesVersion: 3, ServerTimeUs: -5, Nodes: 2, States: []StateV1{
		{Key: "k1", Rule: "api", Window: 1, Allowed: true, Remaining: -3, Lease: 0, LeaseHeld: 0, ResetInMs: 10, RetryInMs: 20, PenaltyInMs: 30, PenaltyLevel: 2},
	}}
	encR, err := AppendReplyV1(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	var gotR ReplyV1
	if err := DecodeReplyV1(encR, &gotR); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&gotR, r) {
		t.Fatalf("reply round trip:\n got %+v\nwant %+v", gotR, *r)
	}
	if v2enc, _ := AppendBatch(nil, sampleBatch(1)); DecodeBatchV1(v2enc, &got) == nil {
		t.Fatal("DecodeBatchV1 accepted a Version 2 batch")
	}
	if PeekVersion(enc) != VersionV1 || PeekVersion(nil) != 0 {
		t.Fatal("PeekVersion")
	}
}
