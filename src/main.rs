//! The `guildhall` command line.

mod cli;

fn main() -> std::process::ExitCode {
    tune_allocator();
    hide_environment();
    cli::main()
}

/// Keeps the server's environment, agents' tokens among it (`token_env`), from the
/// commands it runs, which could otherwise read it in `/proc/<server>/environ`:
/// - the process is made non-dumpable, so its `/proc` entries (`environ`, `mem`, `maps`)
///   belong to root and no other process of its user may read them or trace it;
/// - every variable's value is copied to the heap (where `std::env` then finds it) and
///   wiped from the block the kernel shows as `environ`, which then lists names only. The
///   dynamic loader's own variables (`LD_*`, `GLIBC_TUNABLES`, `GCONV_PATH`, `LOCPATH`) are
///   left in place: the loader may keep pointers into that block.
///
/// Root keeps `CAP_SYS_PTRACE` and can read any process: a server running as root relies on
/// the sandbox (docs/security.md) to keep its commands from the server's `/proc`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn hide_environment() {
    use std::ffi::CStr;
    unsafe extern "C" {
        static environ: *const *mut libc::c_char;
    }
    // SAFETY: `prctl(PR_SET_DUMPABLE, 0)` only changes this process's dumpable flag.
    let _ = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // SAFETY: called first thing in `main`, before any thread exists, so nothing reads or
    // changes the environment meanwhile. `environ` is a NULL-terminated array of
    // NUL-terminated `NAME=value` strings. Each value is set again with `setenv`, which
    // points `environ` at a new heap copy, before the old bytes are overwritten, so no
    // entry of `environ` ever points at wiped bytes.
    unsafe {
        let mut originals = Vec::new();
        let mut at = environ;
        while !at.is_null() && !(*at).is_null() {
            originals.push(*at);
            at = at.add(1);
        }
        for entry in originals {
            let bytes = CStr::from_ptr(entry).to_bytes();
            let Some(eq) = bytes.iter().position(|&b| b == b'=') else {
                continue;
            };
            let name = &bytes[..eq];
            let loader = name.starts_with(b"LD_")
                || [&b"GLIBC_TUNABLES"[..], b"GCONV_PATH", b"LOCPATH"].contains(&name);
            if loader || eq + 1 == bytes.len() {
                continue;
            }
            let (Ok(name), Ok(value)) = (
                std::ffi::CString::new(name),
                std::ffi::CString::new(&bytes[eq + 1..]),
            ) else {
                continue;
            };
            if libc::setenv(name.as_ptr(), value.as_ptr(), 1) == 0 {
                let value_len = bytes.len() - eq - 1;
                std::ptr::write_bytes(entry.add(eq + 1), 0, value_len);
            }
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn hide_environment() {}

/// Two glibc allocator settings, made before any thread starts:
/// - glibc grows each thread's heap by `M_TOP_PAD` (128 KiB) at a time, one `mprotect` call
///   per step. Starting thousands of mailbox actors grows the heap by hundreds of MiB, and
///   those calls were a tenth of the time spent; 64 MiB steps remove them. Memory is still
///   committed only when touched.
/// - glibc makes up to eight arenas a core, and a thread keeps the arena it first took.
///   tokio's blocking threads come and go (a store commit, a file read), each new one on
///   whichever arena is free, and every arena keeps the memory it once held: a server's
///   memory grew for as long as it ran (`bench soak`: 15 KiB/s at 300 calls a second,
///   three quarters of its growth). One arena a core (at least two) keeps the workers off
///   each other's locks and the memory in few arenas.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_allocator() {
    const TOP_PAD: libc::c_int = 64 << 20;
    let arenas = std::thread::available_parallelism()
        .map_or(2, std::num::NonZero::get)
        .max(2);
    // SAFETY: `mallopt` only sets an allocator parameter; it is called before any thread
    // is started, and a refused setting (return 0) leaves the default in place.
    unsafe {
        let _ = libc::mallopt(libc::M_TOP_PAD, TOP_PAD);
        let _ = libc::mallopt(
            libc::M_ARENA_MAX,
            libc::c_int::try_from(arenas).unwrap_or(libc::c_int::MAX),
        );
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}
