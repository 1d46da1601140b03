//! A real PostgreSQL server for the tests that need one: Debian's `postgresql`, installed if
//! missing, `initdb` into a directory under `target/`, `postgres` on a free loopback port.
//! One server per test process, started on first use; each test gets a database of its own.
//! The server is this process's child and gets SIGINT (a fast shutdown) when the process
//! ends (`PR_SET_PDEATHSIG`); as root it runs as the `postgres` user, since it refuses root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The running server: its port and data directory.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// The test process's server, started on first use.
pub fn server() -> &'static Server {
    SERVER.get_or_init(start)
}

/// A new, empty database on the server: its connection string.
pub async fn fresh_database() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let server = server();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let (client, connection) = tokio_postgres::connect(&admin_url(server), tokio_postgres::NoTls)
        .await
        .expect("connect to the test server");
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    drop(client);
    let _ = driver.await;
    format!(
        "host=127.0.0.1 port={} user=guildhall dbname={name}",
        server.port
    )
}

fn admin_url(server: &Server) -> String {
    format!(
        "host=127.0.0.1 port={} user=guildhall dbname=postgres",
        server.port
    )
}

/// The directory of PostgreSQL's programs, installing Debian's package if none is there
/// (once per process: two installs at once would fight over dpkg's lock).
fn bin_dir() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(find_or_install)
}

fn find_or_install() -> PathBuf {
    let find = || {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|bin| bin.join("postgres").is_file() && bin.join("initdb").is_file())
            .collect();
        found.sort();
        found.pop()
    };
    if let Some(bin) = find() {
        return bin;
    }
    let installed = Command::new("sh")
        .args([
            "-c",
            "export DEBIAN_FRONTEND=noninteractive; \
             mkdir -p /etc/postgresql-common/createcluster.d; \
             echo 'create_main_cluster = false' \
               > /etc/postgresql-common/createcluster.d/guildhall.conf; \
             apt-get install -y -q postgresql >/dev/null 2>&1 \
             || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }",
        ])
        .status();
    find().unwrap_or_else(|| {
        panic!(
            "PostgreSQL is needed by these tests and could not be installed ({installed:?}): \
             install Debian's `postgresql` package"
        )
    })
}

/// The `postgres` user's uid and gid, when this process is root (the server refuses root).
#[allow(unsafe_code)]
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the postgres user exists (Debian's package makes it)")
    };
    Some((id("-u"), id("-g")))
}

fn command(program: &Path, user: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

/// A fresh data directory under `target/tmp/postgres`, owned by the user the server runs as.
fn init(name: &str, user: Option<(u32, u32)>) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("postgres");
    std::fs::create_dir_all(&root).expect("make target/tmp/postgres");
    remove_stale(&root);
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make the data directory");
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the data directory");
        // The server must reach its directory through every parent.
        let mut parent = dir.parent();
        while let Some(p) = parent {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(p) {
                let mode = meta.permissions().mode();
                if mode & 0o001 == 0 {
                    let _ =
                        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o001));
                }
            }
            parent = p.parent();
        }
    }
    let init = command(&bin_dir().join("initdb"), user)
        .arg("-D")
        .arg(&dir)
        .args(["-U", "guildhall", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run initdb");
    assert!(
        init.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    dir
}

/// Removes what earlier test processes, now gone, left in `root` (each entry is named by
/// its process id).
fn remove_stale(root: &Path) {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid: String = name.chars().take_while(char::is_ascii_digit).collect();
        if !pid.is_empty() && !Path::new("/proc").join(&pid).exists() {
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
}

/// Starts `postgres` on `dir` and `port`; it gets SIGINT when the thread calling this ends.
#[allow(unsafe_code)]
fn spawn(dir: &Path, port: u16, user: Option<(u32, u32)>) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.with_extension("log"))
        .expect("make the server's log");
    let mut cmd = command(&bin_dir().join("postgres"), user);
    cmd.arg("-D")
        .arg(dir)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
        .arg(dir)
        .args(["-c", "max_connections=300"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: prctl is async-signal-safe; it runs after the uid change, which would
    // otherwise clear it.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("start postgres")
}

fn start() -> Server {
    let user = run_as();
    let dir = init(&std::process::id().to_string(), user);
    let port = free_port();
    // Started by a thread that lives as long as the process: the death signal is sent when
    // the thread that started the child ends.
    let (tx, rx) = std::sync::mpsc::channel();
    let data = dir.clone();
    std::thread::spawn(move || {
        let child = spawn(&data, port, user);
        let _ = tx.send(());
        // Held, not reaped: the server lives as long as this process.
        let _child = child;
        loop {
            std::thread::park();
        }
    });
    rx.recv().expect("postgres started");
    let server = Server { port, dir };
    wait_until_ready(port, &server.dir);
    server
}

/// A server of one test's own, which it may stop and start again; stopped when dropped.
pub struct Owned {
    pub port: u16,
    dir: PathBuf,
    user: Option<(u32, u32)>,
    child: Option<std::process::Child>,
}

impl Owned {
    /// A new server with its own data directory (the test's `name`).
    pub fn start(name: &str) -> Self {
        Self::start_with(name, false)
    }

    /// The same, serving TLS with a self-signed certificate (which no system trusts).
    pub fn start_with_tls(name: &str) -> Self {
        Self::start_with(name, true)
    }

    fn start_with(name: &str, tls: bool) -> Self {
        let user = run_as();
        let dir = init(&format!("{}-{name}", std::process::id()), user);
        if tls {
            let made = command(Path::new("openssl"), user)
                .current_dir(&dir)
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=127.0.0.1",
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.crt",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run openssl");
            assert!(made.success(), "openssl made no certificate");
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(dir.join("postgresql.conf"))
                .expect("open postgresql.conf");
            std::io::Write::write_all(
                &mut conf,
                b"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
            )
            .expect("turn TLS on");
        }
        let mut owned = Self {
            port: free_port(),
            dir,
            user,
            child: None,
        };
        owned.resume();
        owned
    }

    /// The connection string of its `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=guildhall dbname=postgres",
            self.port
        )
    }

    /// Stops it (a fast shutdown: what was committed stays) and waits until it is gone,
    /// whether it is still the one this started or one [`restart_command`](Self::restart_command)
    /// started after it.
    #[allow(unsafe_code)]
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: the pid is our own child's, not yet reaped.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            let _ = child.wait();
        }
        // One pg_ctl started is not our child: its pid is in the directory while it runs.
        let pid_file = self.dir.join("postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            let command = command(&bin_dir().join("pg_ctl"), self.user)
                .arg("-D")
                .arg(&self.dir)
                .args(["-w", "-m", "fast", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            // Said, not asserted: this runs when a test's server is dropped, maybe while
            // the test panics, where a second panic would abort the whole test process.
            if !command.is_ok_and(|s| s.success()) && pid_file.exists() {
                eprintln!(
                    "pg_ctl could not stop the postgres ({pid}) on {}",
                    self.dir.display()
                );
            }
        }
    }

    /// A shell command that restarts it as an operator would (`pg_ctl restart`, as the user
    /// it runs as): what `bench soak --pg-restart` runs. The server it starts is not this
    /// process's child; [`stop`](Self::stop) and dropping stop it all the same.
    pub fn restart_command(&self) -> String {
        let pg_ctl = format!(
            "{} -D {} -w -m fast -l {} restart",
            bin_dir().join("pg_ctl").display(),
            self.dir.display(),
            self.dir.join("restarted.log").display()
        );
        match self.user {
            Some((uid, gid)) => {
                format!("setpriv --reuid={uid} --regid={gid} --clear-groups -- {pg_ctl}")
            }
            None => pg_ctl,
        }
    }

    /// Starts it again on the same directory and port.
    pub fn resume(&mut self) {
        self.child = Some(spawn(&self.dir, self.port, self.user));
        wait_until_ready(self.port, &self.dir);
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits (up to 60 s) until the server on `port` takes connections. On a thread of its
/// own, since the caller may be driving a runtime.
fn wait_until_ready(port: u16, dir: &Path) {
    let log = dir.with_extension("log");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let url = format!("host=127.0.0.1 port={port} user=guildhall dbname=postgres");
        let what = format!("postgres starts (its log: {})", log.display());
        crate::support::eventually_blocking(Duration::from_secs(60), &what, || {
            runtime
                .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
                .ok()
                .map(drop)
        });
    })
    .join()
    .expect("postgres started");
}
