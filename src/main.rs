//! The `guildhall` command line.

mod cli;

fn main() -> std::process::ExitCode {
    tune_allocator();
    cli::main()
}

/// glibc grows each thread's heap by `M_TOP_PAD` (128 KiB) at a time, one `mprotect` call
/// per step. Starting thousands of mailbox actors grows the heap by hundreds of MiB, and those
/// calls were a tenth of the time spent; 64 MiB steps remove them. Memory is still committed
/// only when touched.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_allocator() {
    const TOP_PAD: libc::c_int = 64 << 20;
    // SAFETY: `mallopt` only sets an allocator parameter; it is called before any thread
    // is started, and a refused setting (return 0) leaves the default in place.
    let _ = unsafe { libc::mallopt(libc::M_TOP_PAD, TOP_PAD) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}
