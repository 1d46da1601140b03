//! `web_fetch` against a server on loopback: HTML as Markdown, the size, time and redirect
//! limits, the cache, and no way into loopback or private addresses unless allowed, by
//! name, by address or by redirect. The server counts its requests, so a refusal is proven
//! to have made no connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect};
use axum::routing::get;
use guildhall::fetch::{Fetch, FetchConfig};
use guildhall::{CallError, CallOptions, Runtime};
use serde_json::{Value, json};

const PAGE: &str = "<!doctype html><html><head><title>The  Guild\nhall</title>\
    <style>body { color: red }</style><script>steal()</script></head><body>\
    <h1>Hello</h1><p>Some <b>bold</b> text and a <a href=\"https://example.org/next\">link</a>.</p>\
    <ul><li>first item</li><li>second item</li></ul><pre><code>let x = 1;</code></pre></body></html>";

/// A site on loopback; `hits` counts every request it served.
struct Site {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Shared {
    hits: Arc<AtomicUsize>,
    port: u16,
}

async fn site() -> Site {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let shared = Shared {
        hits: Arc::clone(&hits),
        port: addr.port(),
    };
    let app = Router::new()
        .route("/page", get(|| async { Html(PAGE) }))
        .route("/big", get(|| async { "x".repeat(3 * 1024 * 1024) }))
        .route("/loop", get(|| async { Redirect::temporary("/loop") }))
        .route(
            "/hop/{n}",
            get(|Path(n): Path<u32>| async move {
                if n == 0 {
                    Redirect::temporary("/page")
                } else {
                    Redirect::temporary(&format!("/hop/{}", n - 1))
                }
            }),
        )
        .route(
            "/to-other-port",
            get(|State(s): State<Shared>| async move {
                Redirect::temporary(&format!("http://localhost:{}/page", s.port.wrapping_add(1)))
            }),
        )
        .route(
            "/to-loopback",
            get(|State(s): State<Shared>| async move {
                Redirect::temporary(&format!("http://127.0.0.1:{}/page", s.port))
            }),
        )
        .route(
            "/count",
            get(|State(s): State<Shared>| async move {
                format!("request {}", s.hits.load(Ordering::SeqCst))
            }),
        )
        .route(
            "/image",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "image/png")],
                    vec![0x89, b'P', b'N', b'G', 0, 0],
                )
            }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such page").into_response() }),
        )
        .route("/hang", get(std::future::pending::<String>))
        .route(
            "/deep",
            get(|| async {
                Html(format!(
                    "<title>Deep</title>{}<p>at the bottom</p>{}",
                    "<div>".repeat(3_000),
                    "</div>".repeat(3_000)
                ))
            }),
        )
        .route(
            "/very-deep",
            get(|| async { Html(format!("{}core", "<div><span>".repeat(100_000))) }),
        )
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            |State(s): State<Shared>,
             request: axum::extract::Request,
             next: axum::middleware::Next| async move {
                s.hits.fetch_add(1, Ordering::SeqCst);
                next.run(request).await
            },
        ))
        .with_state(shared);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Site { addr, hits, task }
}

async fn runtime(config: FetchConfig) -> Runtime {
    let fetch = Fetch::new(config).unwrap();
    Runtime::builder().fetch(&fetch).build().await.unwrap()
}

async fn fetch(rt: &Runtime, url: &str) -> Result<Value, CallError> {
    rt.call_json("web_fetch", json!({ "url": url }), CallOptions::new())
        .await
}

/// Private addresses allowed: the local site is reachable.
fn open() -> FetchConfig {
    FetchConfig {
        allow_private: true,
        ..FetchConfig::default()
    }
}

#[tokio::test]
async fn html_comes_back_as_markdown_without_scripts() {
    let site = site().await;
    let rt = runtime(open()).await;
    let page = fetch(&rt, &format!("http://{}/page", site.addr))
        .await
        .unwrap();
    let md = page["content"].as_str().unwrap();
    for expected in [
        "# Hello",
        "**bold**",
        "[link](https://example.org/next)",
        "first item",
        "second item",
        "let x = 1;",
    ] {
        assert!(md.contains(expected), "{expected:?} missing from:\n{md}");
    }
    assert!(
        !md.contains("steal()") && !md.contains("color: red"),
        "{md}"
    );
    assert!(!md.contains('<'), "no tags left:\n{md}");
    assert_eq!(page["title"], json!("The Guild hall"));
    assert_eq!(page["status"], json!(200));
    assert_eq!(page["truncated"], json!(false));
    rt.shutdown().await;
}

/// 3,000 nested `<div>`s once overflowed a runtime thread's stack in the Markdown
/// conversion and aborted the process; 200,000 elements nested without an end are past any
/// stack. Each page comes back as its text, named as such, and the runtime answers on.
#[tokio::test]
async fn a_page_nested_past_any_stack_comes_back_as_its_text() {
    let site = site().await;
    let rt = runtime(open()).await;
    for (path, words) in [("deep", "at the bottom"), ("very-deep", "core")] {
        let page = fetch(&rt, &format!("http://{}/{path}", site.addr))
            .await
            .unwrap();
        let content = page["content"].as_str().unwrap();
        assert!(
            content.contains("elements deep, past the 512"),
            "{content:.200}"
        );
        assert!(content.ends_with(words), "{path}: {content:.200}");
    }
    let page = fetch(&rt, &format!("http://{}/page", site.addr))
        .await
        .unwrap();
    assert!(page["content"].as_str().unwrap().contains("# Hello"));
    rt.shutdown().await;
}

#[tokio::test]
async fn size_time_and_redirects_are_bounded() {
    let site = site().await;
    let rt = runtime(FetchConfig {
        max_bytes: 1024 * 1024,
        max_redirects: 3,
        timeout_secs: 1,
        ..open()
    })
    .await;
    let big = fetch(&rt, &format!("http://{}/big", site.addr))
        .await
        .unwrap();
    assert_eq!(big["truncated"], json!(true));
    assert_eq!(big["bytes"], json!(1024 * 1024));
    assert_eq!(big["content"].as_str().unwrap().len(), 1024 * 1024);

    let err = fetch(&rt, &format!("http://{}/loop", site.addr))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("redirect loop"), "{err}");
    let ok = fetch(&rt, &format!("http://{}/hop/2", site.addr))
        .await
        .unwrap();
    assert_eq!(ok["url"], json!(format!("http://{}/page", site.addr)));
    let err = fetch(&rt, &format!("http://{}/hop/9", site.addr))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than 3 redirects"), "{err}");

    let err = fetch(&rt, &format!("http://{}/hang", site.addr))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("timed out"), "{err}");
    let err = fetch(&rt, &format!("http://{}/missing", site.addr))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("404 Not Found: no such page"), "{err}");
    let err = fetch(&rt, &format!("http://{}/image", site.addr))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("image/png") && err.contains("not text"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn private_addresses_are_refused_without_a_connection() {
    let site = site().await;
    let rt = runtime(FetchConfig::default()).await;
    let port = site.addr.port();
    for (url, why) in [
        (
            format!("http://127.0.0.1:{port}/page"),
            "a loopback address",
        ),
        (
            format!("http://localhost:{port}/page"),
            "a loopback address",
        ),
        (
            format!("http://LocalHost:{port}/page"),
            "a loopback address",
        ),
        (format!("http://[::1]:{port}/page"), "a loopback address"),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/page"),
            "a loopback address",
        ),
        // Other spellings of 127.0.0.1, as browsers read them.
        (
            format!("http://2130706433:{port}/page"),
            "a loopback address",
        ),
        (
            format!("http://0x7f.0.0.1:{port}/page"),
            "a loopback address",
        ),
        (format!("http://127.1:{port}/page"), "a loopback address"),
        (format!("http://0.0.0.0:{port}/page"), "\"this network\""),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "link-local",
        ),
        ("http://10.0.0.1/".into(), "a private address"),
        ("http://192.168.0.1/".into(), "a private address"),
        ("http://[fd00::1]/".into(), "unique local"),
        ("http://100.64.0.1/".into(), "carrier-grade"),
        ("file:///etc/passwd".into(), "not an http or https URL"),
        ("ftp://example.org/".into(), "not an http or https URL"),
        ("not a url".into(), "is not a URL"),
    ] {
        let err = fetch(&rt, &url).await.unwrap_err().to_string();
        assert!(err.contains(why), "{url}: {err}");
    }
    assert_eq!(
        site.hits.load(Ordering::SeqCst),
        0,
        "no request reached the site"
    );

    // A host allowed by name and port is reachable; a redirect from it to an address, or to
    // another of its ports, is checked; the bare name is its default port only.
    let rt = runtime(FetchConfig {
        allow_hosts: vec![format!("localhost:{port}")],
        ..FetchConfig::default()
    })
    .await;
    fetch(&rt, &format!("http://localhost:{port}/page"))
        .await
        .unwrap();
    let err = fetch(&rt, &format!("http://localhost:{port}/to-loopback"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused: 127.0.0.1"), "{err}");
    let err = fetch(&rt, &format!("http://localhost:{port}/to-other-port"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("allow_hosts` names"), "{err}");
    assert_eq!(
        site.hits.load(Ordering::SeqCst),
        3,
        "the page and the two redirects, not their targets"
    );
    let bare = runtime(FetchConfig {
        allow_hosts: vec!["localhost".into()],
        ..FetchConfig::default()
    })
    .await;
    let err = fetch(&bare, &format!("http://localhost:{port}/page"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("allow_hosts` names"), "{err}");
    assert_eq!(
        site.hits.load(Ordering::SeqCst),
        3,
        "refused before connecting"
    );
    bare.shutdown().await;
    rt.shutdown().await;
}

#[tokio::test]
async fn pages_are_cached_for_their_time_to_live() {
    let site = site().await;
    let url = format!("http://{}/count", site.addr);
    let rt = runtime(open()).await;
    let first = fetch(&rt, &url).await.unwrap();
    let second = fetch(&rt, &url).await.unwrap();
    assert_eq!(first["cached"], json!(false));
    assert_eq!(second["cached"], json!(true));
    assert_eq!(first["content"], second["content"]);
    assert_eq!(site.hits.load(Ordering::SeqCst), 1);
    rt.shutdown().await;

    let rt = runtime(FetchConfig {
        cache_ttl_secs: 0,
        ..open()
    })
    .await;
    let third = fetch(&rt, &url).await.unwrap();
    assert_eq!(third["cached"], json!(false));
    assert_eq!(site.hits.load(Ordering::SeqCst), 2);
    assert_ne!(third["content"], first["content"]);
    rt.shutdown().await;
}

#[test]
fn unusable_settings_are_refused() {
    for (config, why) in [
        (
            FetchConfig {
                timeout_secs: 0,
                ..FetchConfig::default()
            },
            "timeout_secs is 0",
        ),
        (
            FetchConfig {
                max_bytes: 0,
                ..FetchConfig::default()
            },
            "max_bytes is 0",
        ),
    ] {
        let err = Fetch::new(config).err().unwrap().to_string();
        assert!(err.contains(why), "{err}");
    }
}
