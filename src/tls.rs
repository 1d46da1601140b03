//! HTTPS for guildhall's HTTP clients (`web_fetch`, proxied Streamable HTTP servers): rustls
//! with the ring provider, which builds without a C toolchain, and the system's roots
//! (reqwest's platform verifier). A leaf.

/// Makes ring the process's rustls provider unless one is already chosen (an embedder's
/// own choice stands). Every HTTP client is built after this.
pub(crate) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // `Err` means a provider is installed already: that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
