;; WASI functions that Go's wasip1 runtime imports but that Envoy's proxy-wasm host either
;; never offered (sched_yield, poll_oneoff, fd_fdstat_set_flags before proxy-wasm-cpp-host
;; PR 427), answered with an error that makes the runtime abort (poll_oneoff before PR 533,
;; golang/go#78513), or refuses while _initialize runs (fd_fdstat_get, fd_fdstat_set_flags
;; before PR 427). wasmbuild.Link copies these functions into the module and points the
;; module's calls at them, so none of them is imported from the host any more.
;;
;; Every export here has exactly the signature Go declares with //go:wasmimport; Link
;; refuses to link a function whose signature differs. The module shares the filter's
;; memory (index 0) and may use no globals, tables or calls: Link only renumbers types.
;;
;; Regenerate shim.wasm after an edit: go generate ./filter/wasmbuild (needs wat2wasm,
;; Debian package wabt; make test installs it and TestShimUpToDate checks the copy).
(module
  (import "tollgate" "memory" (memory 0))

  ;; sched_yield() -> errno. A proxy-wasm VM is single-threaded: there is no one to yield
  ;; to, so yielding succeeds at once (Go calls it only from notetsleepg's wait loop).
  (func (export "sched_yield") (result i32)
    (i32.const 0))

  ;; fd_fdstat_get(fd, *fdstat) -> errno. Go calls it at start-up for stdin, stdout and
  ;; stderr (syscall's init asks whether they are non-blocking; os.NewFile asks again).
  ;; The answer: a character device with every right and no flags, so os treats stdio as
  ;; blocking files and never registers them with the netpoller. Writes still go to the
  ;; host's fd_write (Envoy logs them). The filter opens no files, so any other
  ;; descriptor is EBADF (8).
  ;; fdstat: filetype u8 @0, flags u16 @2, rights_base u64 @8, rights_inheriting u64 @16.
  (func (export "fd_fdstat_get") (param $fd i32) (param $buf i32) (result i32)
    (if (i32.gt_u (local.get $fd) (i32.const 2))
      (then (return (i32.const 8))))
    (i64.store (local.get $buf) (i64.const 2))            ;; filetype 2: character_device; flags 0
    (i64.store offset=8 (local.get $buf) (i64.const -1))  ;; rights_base: all
    (i64.store offset=16 (local.get $buf) (i64.const -1)) ;; rights_inheriting: all
    (i32.const 0))

  ;; fd_fdstat_set_flags(fd, flags) -> errno. Go asks for non-blocking stdio at start-up
  ;; and ignores a refusal; ENOTSUP (58) keeps the flags fd_fdstat_get reports true.
  (func (export "fd_fdstat_set_flags") (param i32 i32) (result i32)
    (i32.const 58))

  ;; poll_oneoff(in *subscription, out *event, n, *nevents) -> errno. Go calls it from
  ;; usleep (spin back-off) and from netpoll, which the runtime runs at every
  ;; start-the-world of a garbage collection once a timer or a file has initialised the
  ;; poller, and to sleep until the next timer when no goroutine can run.
  ;; A proxy-wasm VM must never block its worker thread, so every subscription is
  ;; reported as having occurred at once: clocks as expired, descriptors as ready (the
  ;; caller then retries the I/O, which a proxy host never makes wait). For usleep and a
  ;; zero timeout that is exactly right; a timed wait returns early and the scheduler
  ;; re-checks its timers, as it does after any early wake-up. n = 0 is EINVAL (28),
  ;; as in WASI.
  ;; subscription (48 bytes): userdata u64 @0, tag u8 @8, union @16.
  ;; event (32 bytes): userdata u64 @0, error u16 @8, type u8 @10, nbytes u64 @16,
  ;; flags u16 @24.
  (func (export "poll_oneoff") (param $in i32) (param $out i32) (param $n i32) (param $nevents i32) (result i32)
    (local $i i32)
    (if (i32.eqz (local.get $n))
      (then (return (i32.const 28))))
    (loop $each
      (i64.store (local.get $out) (i64.load (local.get $in)))
      ;; error 0, type = the subscription's tag, padding 0
      (i64.store offset=8 (local.get $out)
        (i64.shl (i64.load8_u offset=8 (local.get $in)) (i64.const 16)))
      (i64.store offset=16 (local.get $out) (i64.const 0))
      (i64.store offset=24 (local.get $out) (i64.const 0))
      (local.set $in (i32.add (local.get $in) (i32.const 48)))
      (local.set $out (i32.add (local.get $out) (i32.const 32)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $each (i32.lt_u (local.get $i) (local.get $n))))
    (i32.store (local.get $nevents) (local.get $n))
    (i32.const 0))
)
