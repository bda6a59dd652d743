;; DEFLATE decoding (RFC 1951) for Pack: a packed module keeps its data section as one
;; compressed passive segment and expands it with $inflate at the start of _initialize,
;; before the Go runtime reads any of it. It is written here by hand because it has to run
;; before any Go code can: no Go function works until the data it decodes is in place.
;; Canonical Huffman codes are decoded with a 9-bit lookup table per tree, and a code
;; longer than that a bit at a time (counts per code length, symbols in code order),
;; which keeps the code small; decoding runs once per VM.
;;
;; Pack merges the functions below into the module (their calls and types renumbered);
;; the memory is the module's memory 0. `go generate` compiles this file to inflate.wasm,
;; and a test checks the committed binary is up to date.
;;
;; The work area $w (WorkBytes in pack.go), offsets from $w:
;;    0  literal/length tree: counts u16[16], then symbols u16[288] at 32
;;  608  distance tree: counts u16[16], then symbols u16[32] at 640
;;  704  code lengths u8[320]
;; 1024  next symbol slot, then next code, per code length u16[16] (building a tree)
;; 1056  length codes' extra bits u8[30]; 1088 their base lengths u16[30]
;; 1152  distance codes' extra bits u8[30]; 1184 their base distances u16[30]
;; 1248  order of the code length code lengths u8[19]
;; 1280  bit reader: next input byte i32, bit buffer i32, bits in the buffer i32
;; 1296  literal/length tree's lookup table u16[512]; 2320 distance tree's u16[512]
(module
  (import "env" "memory" (memory 0))

  ;; $bits takes the next $n (at most 16) bits of the input, least significant first.
  (func $bits (param $w i32) (param $n i32) (result i32)
    (local $src i32) (local $bb i32) (local $bc i32) (local $v i32)
    (local.set $src (i32.load offset=1280 (local.get $w)))
    (local.set $bb (i32.load offset=1284 (local.get $w)))
    (local.set $bc (i32.load offset=1288 (local.get $w)))
    (block $full
      (loop $fill
        (br_if $full (i32.ge_u (local.get $bc) (local.get $n)))
        (local.set $bb (i32.or (local.get $bb)
          (i32.shl (i32.load8_u (local.get $src)) (local.get $bc))))
        (local.set $src (i32.add (local.get $src) (i32.const 1)))
        (local.set $bc (i32.add (local.get $bc) (i32.const 8)))
        (br $fill)))
    (local.set $v (i32.and (local.get $bb)
      (i32.sub (i32.shl (i32.const 1) (local.get $n)) (i32.const 1))))
    (i32.store offset=1280 (local.get $w) (local.get $src))
    (i32.store offset=1284 (local.get $w) (i32.shr_u (local.get $bb) (local.get $n)))
    (i32.store offset=1288 (local.get $w) (i32.sub (local.get $bc) (local.get $n)))
    (local.get $v))

  ;; $table is where the lookup table of the tree at $t is: each tree has its own.
  (func $table (param $w i32) (param $t i32) (result i32)
    (i32.add (i32.add (local.get $w) (i32.const 1296))
      (i32.shl (i32.ne (local.get $t) (local.get $w)) (i32.const 10))))

  ;; $symbol decodes one symbol with the tree at $t; -1 if no code of 15 bits or less
  ;; matches (a malformed stream). A code of up to 9 bits, nearly every one, is found
  ;; with one look at the tree's table; a longer one bit by bit.
  (func $symbol (param $w i32) (param $t i32) (result i32)
    (local $src i32) (local $bb i32) (local $bc i32)
    (local $len i32) (local $code i32) (local $first i32) (local $count i32) (local $e i32)
    (local.set $src (i32.load offset=1280 (local.get $w)))
    (local.set $bb (i32.load offset=1284 (local.get $w)))
    (local.set $bc (i32.load offset=1288 (local.get $w)))
    ;; Nine bits in the buffer. At the end of the stream this reads up to two bytes past
    ;; it (the work area follows it), but consumes only the code's own bits.
    (block $full
      (loop $fill
        (br_if $full (i32.ge_u (local.get $bc) (i32.const 9)))
        (local.set $bb (i32.or (local.get $bb)
          (i32.shl (i32.load8_u (local.get $src)) (local.get $bc))))
        (local.set $src (i32.add (local.get $src) (i32.const 1)))
        (local.set $bc (i32.add (local.get $bc) (i32.const 8)))
        (br $fill)))
    (local.set $e (i32.load16_u (i32.add (call $table (local.get $w) (local.get $t))
      (i32.shl (i32.and (local.get $bb) (i32.const 511)) (i32.const 1)))))
    (if (local.get $e)
      (then
        (local.set $len (i32.shr_u (local.get $e) (i32.const 9)))
        (i32.store offset=1280 (local.get $w) (local.get $src))
        (i32.store offset=1284 (local.get $w) (i32.shr_u (local.get $bb) (local.get $len)))
        (i32.store offset=1288 (local.get $w) (i32.sub (local.get $bc) (local.get $len)))
        (return (i32.and (local.get $e) (i32.const 511)))))
    (block $found
      (loop $bit
        (if (i32.eqz (local.get $bc))
          (then
            (local.set $bb (i32.load8_u (local.get $src)))
            (local.set $src (i32.add (local.get $src) (i32.const 1)))
            (local.set $bc (i32.const 8))))
        (local.set $code (i32.or (i32.shl (local.get $code) (i32.const 1))
          (i32.and (local.get $bb) (i32.const 1))))
        (local.set $bb (i32.shr_u (local.get $bb) (i32.const 1)))
        (local.set $bc (i32.sub (local.get $bc) (i32.const 1)))
        (local.set $len (i32.add (local.get $len) (i32.const 1)))
        (if (i32.gt_u (local.get $len) (i32.const 15))
          (then (return (i32.const -1))))
        (local.set $count (i32.load16_u
          (i32.add (local.get $t) (i32.shl (local.get $len) (i32.const 1)))))
        (br_if $found (i32.lt_s (local.get $code) (local.get $count)))
        (local.set $first (i32.add (local.get $first) (local.get $count)))
        (local.set $code (i32.sub (local.get $code) (local.get $count)))
        (br $bit)))
    (i32.store offset=1280 (local.get $w) (local.get $src))
    (i32.store offset=1284 (local.get $w) (local.get $bb))
    (i32.store offset=1288 (local.get $w) (local.get $bc))
    (i32.load16_u offset=32 (i32.add (local.get $t)
      (i32.shl (i32.add (local.get $first) (local.get $code)) (i32.const 1)))))

  ;; $tree builds the tree at $t from $num code lengths at $lens, and its table: for
  ;; each value of the next 9 input bits that starts with a code of at most 9 bits,
  ;; that code's length and symbol (length << 9 | symbol; 0 for none).
  (func $tree (param $w i32) (param $t i32) (param $lens i32) (param $num i32)
    (local $i i32) (local $l i32) (local $sum i32) (local $slot i32)
    (local $tab i32) (local $code i32) (local $rev i32) (local $k i32) (local $e i32)
    (memory.fill (local.get $t) (i32.const 0) (i32.const 32))
    (local.set $i (i32.const 0))
    (block $done
      (loop $count
        (br_if $done (i32.ge_u (local.get $i) (local.get $num)))
        (local.set $slot (i32.add (local.get $t)
          (i32.shl (i32.load8_u (i32.add (local.get $lens) (local.get $i))) (i32.const 1))))
        (i32.store16 (local.get $slot) (i32.add (i32.load16_u (local.get $slot)) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $count)))
    (i32.store16 (local.get $t) (i32.const 0))
    (local.set $i (i32.const 0))
    (block $done
      (loop $offsets
        (br_if $done (i32.ge_u (local.get $i) (i32.const 16)))
        (i32.store16 offset=1024 (i32.add (local.get $w) (i32.shl (local.get $i) (i32.const 1)))
          (local.get $sum))
        (local.set $sum (i32.add (local.get $sum)
          (i32.load16_u (i32.add (local.get $t) (i32.shl (local.get $i) (i32.const 1))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $offsets)))
    (local.set $i (i32.const 0))
    (block $done
      (loop $place
        (br_if $done (i32.ge_u (local.get $i) (local.get $num)))
        (local.set $l (i32.load8_u (i32.add (local.get $lens) (local.get $i))))
        (if (local.get $l)
          (then
            (local.set $slot (i32.add (local.get $w) (i32.shl (local.get $l) (i32.const 1))))
            (i32.store16 offset=32
              (i32.add (local.get $t) (i32.shl (i32.load16_u offset=1024 (local.get $slot)) (i32.const 1)))
              (local.get $i))
            (i32.store16 offset=1024 (local.get $slot)
              (i32.add (i32.load16_u offset=1024 (local.get $slot)) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $place)))
    ;; The first code of each length (canonical codes: RFC 1951 3.2.2), where the
    ;; symbol slots were.
    (local.set $i (i32.const 1))
    (block $done
      (loop $firsts
        (br_if $done (i32.ge_u (local.get $i) (i32.const 16)))
        (local.set $code (i32.shl (i32.add (local.get $code)
          (i32.load16_u (i32.add (local.get $t) (i32.shl (i32.sub (local.get $i) (i32.const 1)) (i32.const 1)))))
          (i32.const 1)))
        (i32.store16 offset=1024 (i32.add (local.get $w) (i32.shl (local.get $i) (i32.const 1)))
          (local.get $code))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $firsts)))
    (local.set $tab (call $table (local.get $w) (local.get $t)))
    (memory.fill (local.get $tab) (i32.const 0) (i32.const 1024))
    (local.set $i (i32.const 0))
    (block $done
      (loop $short
        (br_if $done (i32.ge_u (local.get $i) (local.get $num)))
        (local.set $l (i32.load8_u (i32.add (local.get $lens) (local.get $i))))
        (if (i32.and (i32.ne (local.get $l) (i32.const 0)) (i32.le_u (local.get $l) (i32.const 9)))
          (then
            (local.set $slot (i32.add (local.get $w) (i32.shl (local.get $l) (i32.const 1))))
            (local.set $code (i32.load16_u offset=1024 (local.get $slot)))
            (i32.store16 offset=1024 (local.get $slot) (i32.add (local.get $code) (i32.const 1)))
            ;; The stream holds a code's first bit first: the table's index is the
            ;; code reversed, followed by any bits.
            (local.set $rev (i32.const 0))
            (local.set $k (local.get $l))
            (loop $reverse
              (local.set $rev (i32.or (i32.shl (local.get $rev) (i32.const 1))
                (i32.and (local.get $code) (i32.const 1))))
              (local.set $code (i32.shr_u (local.get $code) (i32.const 1)))
              (local.set $k (i32.sub (local.get $k) (i32.const 1)))
              (br_if $reverse (local.get $k)))
            (local.set $e (i32.or (i32.shl (local.get $l) (i32.const 9)) (local.get $i)))
            (loop $fill
              (i32.store16 (i32.add (local.get $tab) (i32.shl (local.get $rev) (i32.const 1)))
                (local.get $e))
              (local.set $rev (i32.add (local.get $rev) (i32.shl (i32.const 1) (local.get $l))))
              (br_if $fill (i32.lt_u (local.get $rev) (i32.const 512))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $short))))

  ;; $bases fills the extra bits and base values of 30 length or distance codes: the
  ;; first $delta codes have no extra bits, then every $delta codes one bit more.
  (func $bases (param $bits i32) (param $base i32) (param $delta i32) (param $first i32)
    (local $i i32) (local $sum i32) (local $b i32)
    (local.set $sum (local.get $first))
    (block $done
      (loop $code
        (br_if $done (i32.ge_u (local.get $i) (i32.const 30)))
        (local.set $b (select (i32.const 0)
          (i32.div_u (i32.sub (local.get $i) (local.get $delta)) (local.get $delta))
          (i32.lt_u (local.get $i) (local.get $delta))))
        (i32.store8 (i32.add (local.get $bits) (local.get $i)) (local.get $b))
        (i32.store16 (i32.add (local.get $base) (i32.shl (local.get $i) (i32.const 1)))
          (local.get $sum))
        (local.set $sum (i32.add (local.get $sum) (i32.shl (i32.const 1) (local.get $b))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $code))))

  ;; $dynamic reads a dynamic block's code lengths and builds both trees; 0 if malformed.
  (func $dynamic (param $w i32) (result i32)
    (local $hlit i32) (local $total i32) (local $hclen i32) (local $i i32)
    (local $sym i32) (local $rep i32) (local $val i32)
    (local.set $hlit (i32.add (call $bits (local.get $w) (i32.const 5)) (i32.const 257)))
    (local.set $total (i32.add (local.get $hlit)
      (i32.add (call $bits (local.get $w) (i32.const 5)) (i32.const 1))))
    (local.set $hclen (i32.add (call $bits (local.get $w) (i32.const 4)) (i32.const 4)))
    (memory.fill (i32.add (local.get $w) (i32.const 704)) (i32.const 0) (i32.const 19))
    (block $done
      (loop $order
        (br_if $done (i32.ge_u (local.get $i) (local.get $hclen)))
        (i32.store8 offset=704 (i32.add (local.get $w)
            (i32.load8_u offset=1248 (i32.add (local.get $w) (local.get $i))))
          (call $bits (local.get $w) (i32.const 3)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $order)))
    ;; The code length code goes in the literal tree's place until the lengths are read.
    (call $tree (local.get $w) (local.get $w) (i32.add (local.get $w) (i32.const 704)) (i32.const 19))
    (local.set $i (i32.const 0))
    (block $done
      (loop $lengths
        (br_if $done (i32.ge_u (local.get $i) (local.get $total)))
        (local.set $sym (call $symbol (local.get $w) (local.get $w)))
        (if (i32.lt_s (local.get $sym) (i32.const 16))
          (then
            (if (i32.lt_s (local.get $sym) (i32.const 0)) (then (return (i32.const 0))))
            (i32.store8 offset=704 (i32.add (local.get $w) (local.get $i)) (local.get $sym))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $lengths)))
        (local.set $val (i32.const 0))
        (if (i32.eq (local.get $sym) (i32.const 16))
          (then
            (if (i32.eqz (local.get $i)) (then (return (i32.const 0))))
            (local.set $val (i32.load8_u offset=703 (i32.add (local.get $w) (local.get $i))))
            (local.set $rep (i32.add (call $bits (local.get $w) (i32.const 2)) (i32.const 3))))
          (else
            (if (i32.eq (local.get $sym) (i32.const 17))
              (then (local.set $rep (i32.add (call $bits (local.get $w) (i32.const 3)) (i32.const 3))))
              (else (local.set $rep (i32.add (call $bits (local.get $w) (i32.const 7)) (i32.const 11)))))))
        (if (i32.gt_u (i32.add (local.get $i) (local.get $rep)) (local.get $total))
          (then (return (i32.const 0))))
        (memory.fill (i32.add (i32.add (local.get $w) (i32.const 704)) (local.get $i))
          (local.get $val) (local.get $rep))
        (local.set $i (i32.add (local.get $i) (local.get $rep)))
        (br $lengths)))
    (call $tree (local.get $w) (local.get $w) (i32.add (local.get $w) (i32.const 704)) (local.get $hlit))
    (call $tree (local.get $w) (i32.add (local.get $w) (i32.const 608))
      (i32.add (i32.add (local.get $w) (i32.const 704)) (local.get $hlit))
      (i32.sub (local.get $total) (local.get $hlit)))
    (i32.const 1))

  ;; $inflate decodes the raw DEFLATE stream at $src to $dst and returns the end of the
  ;; output, or -1 if the stream is malformed. The work area at $w needs no clearing.
  (func $inflate (export "inflate") (param $src i32) (param $dst i32) (param $w i32) (result i32)
    (local $start i32) (local $final i32) (local $type i32) (local $sym i32)
    (local $len i32) (local $dist i32) (local $end i32)
    (local.set $start (local.get $dst))
    (i32.store offset=1280 (local.get $w) (local.get $src))
    (i32.store offset=1284 (local.get $w) (i32.const 0))
    (i32.store offset=1288 (local.get $w) (i32.const 0))
    (call $bases (i32.add (local.get $w) (i32.const 1056)) (i32.add (local.get $w) (i32.const 1088))
      (i32.const 4) (i32.const 3))
    ;; Length code 285 is 258 with no extra bits, not where the series would put it.
    (i32.store8 offset=1084 (local.get $w) (i32.const 0))
    (i32.store16 offset=1144 (local.get $w) (i32.const 258))
    (call $bases (i32.add (local.get $w) (i32.const 1152)) (i32.add (local.get $w) (i32.const 1184))
      (i32.const 2) (i32.const 1))
    ;; Code length code order: 16 17 18 0 8 7 9 6 10 5 11 4 12 3 13 2 14 1 15.
    (i64.store offset=1248 (local.get $w) (i64.const 0x0609070800121110))
    (i64.store offset=1256 (local.get $w) (i64.const 0x020d030c040b050a))
    (i32.store16 offset=1264 (local.get $w) (i32.const 0x010e))
    (i32.store8 offset=1266 (local.get $w) (i32.const 15))
    (block $malformed
      (loop $block
        (local.set $final (call $bits (local.get $w) (i32.const 1)))
        (local.set $type (call $bits (local.get $w) (i32.const 2)))
        (if (i32.eqz (local.get $type))
          (then
            ;; Stored: skip to a byte boundary; the whole bytes still in the buffer are
            ;; the block's header, so read from them again.
            (local.set $src (i32.sub (i32.load offset=1280 (local.get $w))
              (i32.shr_u (i32.load offset=1288 (local.get $w)) (i32.const 3))))
            (local.set $len (i32.load16_u (local.get $src)))
            (br_if $malformed (i32.ne (i32.xor (local.get $len) (i32.const 0xffff))
              (i32.load16_u offset=2 (local.get $src))))
            (memory.copy (local.get $dst) (i32.add (local.get $src) (i32.const 4)) (local.get $len))
            (local.set $dst (i32.add (local.get $dst) (local.get $len)))
            (i32.store offset=1280 (local.get $w)
              (i32.add (local.get $src) (i32.add (local.get $len) (i32.const 4))))
            (i32.store offset=1284 (local.get $w) (i32.const 0))
            (i32.store offset=1288 (local.get $w) (i32.const 0)))
          (else
            (if (i32.eq (local.get $type) (i32.const 1))
              (then
                ;; Fixed codes: 0-143 eight bits, 144-255 nine, 256-279 seven,
                ;; 280-287 eight; every distance five.
                (memory.fill (i32.add (local.get $w) (i32.const 704)) (i32.const 8) (i32.const 144))
                (memory.fill (i32.add (local.get $w) (i32.const 848)) (i32.const 9) (i32.const 112))
                (memory.fill (i32.add (local.get $w) (i32.const 960)) (i32.const 7) (i32.const 24))
                (memory.fill (i32.add (local.get $w) (i32.const 984)) (i32.const 8) (i32.const 8))
                (memory.fill (i32.add (local.get $w) (i32.const 992)) (i32.const 5) (i32.const 30))
                (call $tree (local.get $w) (local.get $w) (i32.add (local.get $w) (i32.const 704)) (i32.const 288))
                (call $tree (local.get $w) (i32.add (local.get $w) (i32.const 608))
                  (i32.add (local.get $w) (i32.const 992)) (i32.const 30)))
              (else
                (br_if $malformed (i32.ne (local.get $type) (i32.const 2)))
                (br_if $malformed (i32.eqz (call $dynamic (local.get $w))))))
            (block $end
              (loop $symbols
                (local.set $sym (call $symbol (local.get $w) (local.get $w)))
                (if (i32.lt_u (local.get $sym) (i32.const 256))
                  (then
                    (i32.store8 (local.get $dst) (local.get $sym))
                    (local.set $dst (i32.add (local.get $dst) (i32.const 1)))
                    (br $symbols)))
                (br_if $end (i32.eq (local.get $sym) (i32.const 256)))
                ;; -1 (malformed) is above every length code as an unsigned number.
                (local.set $sym (i32.sub (local.get $sym) (i32.const 257)))
                (br_if $malformed (i32.ge_u (local.get $sym) (i32.const 29)))
                (local.set $len (i32.add
                  (i32.load16_u offset=1088 (i32.add (local.get $w) (i32.shl (local.get $sym) (i32.const 1))))
                  (call $bits (local.get $w) (i32.load8_u offset=1056 (i32.add (local.get $w) (local.get $sym))))))
                (local.set $sym (call $symbol (local.get $w) (i32.add (local.get $w) (i32.const 608))))
                (br_if $malformed (i32.ge_u (local.get $sym) (i32.const 30)))
                (local.set $dist (i32.add
                  (i32.load16_u offset=1184 (i32.add (local.get $w) (i32.shl (local.get $sym) (i32.const 1))))
                  (call $bits (local.get $w) (i32.load8_u offset=1152 (i32.add (local.get $w) (local.get $sym))))))
                (br_if $malformed (i32.gt_u (local.get $dist) (i32.sub (local.get $dst) (local.get $start))))
                (if (i32.ge_u (local.get $dist) (local.get $len))
                  (then (memory.copy (local.get $dst) (i32.sub (local.get $dst) (local.get $dist)) (local.get $len))
                    (local.set $dst (i32.add (local.get $dst) (local.get $len))))
                  (else
                    ;; The copy overlaps its own output: byte by byte, so a short
                    ;; distance repeats.
                    (local.set $end (i32.add (local.get $dst) (local.get $len)))
                    (block $copied
                      (loop $copy
                        (br_if $copied (i32.ge_u (local.get $dst) (local.get $end)))
                        (i32.store8 (local.get $dst)
                          (i32.load8_u (i32.sub (local.get $dst) (local.get $dist))))
                        (local.set $dst (i32.add (local.get $dst) (i32.const 1)))
                        (br $copy)))))
                (br $symbols)))))
        (br_if $block (i32.eqz (local.get $final))))
      (return (local.get $dst)))
    (i32.const -1)))
