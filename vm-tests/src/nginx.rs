//! Real HTTP backends: Debian's nginx in a backend namespace, one process
//! (`master_process off`, so the guard's PID is the whole server), serving
//! `NAME\n` on `/` (so a client sees which backend answered), nginx's
//! `stub_status` on `/status`, files a test puts on `/files/`, and `/health`: 200 while it is healthy,
//! 503 once a test says it is not ([`Nginx::set_healthy`]: what a health
//! check sees, the rest served as before); its files live in a folder of
//! its own, removed with it.
//!
//! Invariant: the server is killed (by its own PID) and its folder removed
//! when the guard drops, also when a test panics.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::netns::Netns;
use crate::procs::Spawned;

/// One nginx server.
#[derive(Debug)]
pub struct Nginx {
    _proc: Spawned,
    dir: PathBuf,
    ns: String,
    status_url: String,
    /// The name it answers with.
    pub name: String,
}

/// nginx's own counters (`stub_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NginxStatus {
    /// Connections accepted.
    pub accepts: u64,
    /// Requests served.
    pub requests: u64,
}

impl Nginx {
    /// Starts nginx in `ns` on `addr:port`, answering `name`; waits until
    /// it accepts connections.
    pub fn start(ns: &Netns, addr: Ipv4Addr, port: u16, name: &str) -> std::io::Result<Nginx> {
        Nginx::start_on(ns, &[SocketAddr::from((addr, port))], name)
    }

    /// Starts nginx on every backend of `t`, port 8080, backend `i`
    /// answering `b{i}`.
    pub fn on_backends(t: &crate::topology::Topology) -> std::io::Result<Vec<Nginx>> {
        t.backends
            .iter()
            .enumerate()
            .map(|(i, b)| Nginx::start(&b.ns, b.addr, 8080, &format!("b{i}")))
            .collect()
    }

    /// Starts nginx in `ns` listening on every address of `on` (the first
    /// is the one its status is read on), answering `name`.
    pub fn start_on(ns: &Netns, on: &[SocketAddr], name: &str) -> std::io::Result<Nginx> {
        let Some(first) = on.first() else {
            return Err(std::io::Error::other("nginx: no address to listen on"));
        };
        let listen: String = on
            .iter()
            .map(|a| format!("                 listen {a} backlog=4096;\n"))
            .collect();
        let dir = std::env::temp_dir().join(format!("xvs-nginx-{}-{name}", ns.name()));
        std::fs::create_dir_all(&dir)?;
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n\
               access_log off;\n\
               client_body_temp_path {d}/body;\n\
               proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n\
               scgi_temp_path {d}/scgi;\n\
               keepalive_requests 1000000;\n\
               server {{\n\
{listen}\
                 location = /status {{ stub_status; }}\n\
                 location = /health {{ root {d}/www; default_type text/plain; try_files /health =503; }}\n\
                 location /files/ {{ alias {d}/www/; default_type application/octet-stream; }}\n\
                 location / {{ default_type text/plain; return 200 \"{name}\\n\"; }}\n\
               }}\n\
             }}\n"
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf)?;
        std::fs::create_dir_all(dir.join("www"))?;
        std::fs::write(dir.join("www/health"), "ok\n")?;
        let mut cmd = ns.command("nginx");
        cmd.args(["-p", &d.to_string(), "-c"])
            .arg(&path)
            .args(["-g", "daemon off; master_process off;"]);
        let url = format!("http://{first}/status");
        let proc = Spawned::start_until(cmd, "nginx", Duration::from_secs(10), || {
            ns.exec("curl", &["-sf", "-m", "1", &url]).is_ok()
        })
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        Ok(Nginx {
            _proc: proc,
            dir,
            ns: ns.name().to_owned(),
            status_url: url,
            name: name.to_owned(),
        })
    }

    /// Serves `size` bytes at `/files/NAME`.
    pub fn put_file(&self, name: &str, size: usize) -> std::io::Result<()> {
        std::fs::write(self.dir.join("www").join(name), vec![b'x'; size])
    }

    /// Makes `/health` answer 200 (`true`) or 503 (`false`); everything
    /// else is served as before.
    pub fn set_healthy(&self, healthy: bool) -> std::io::Result<()> {
        let f = self.dir.join("www/health");
        if healthy {
            std::fs::write(f, "ok\n")
        } else {
            std::fs::remove_file(f)
        }
    }

    /// Its counters, asked over a connection of its own from its
    /// namespace (which itself counts one accept and one request).
    pub fn status(&self) -> Option<NginxStatus> {
        let out = Netns::existing(&self.ns)
            .exec("curl", &["-sf", "-m", "2", &self.status_url])
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut numbers = text
            .lines()
            .nth(2)?
            .split_whitespace()
            .filter_map(|v| v.parse::<u64>().ok());
        let accepts = numbers.next()?;
        let _handled = numbers.next()?;
        Some(NginxStatus {
            accepts,
            requests: numbers.next()?,
        })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
