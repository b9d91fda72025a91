//! The web view in a real browser: xvs in the namespace harness with its
//! TCP admin listener, wrk through the VIP and SYNs to a port no service
//! serves, then Debian's Chromium, headless in the gateway's namespace,
//! opens `/ui` with the token in the URL fragment. The page's DOM (after
//! its scripts ran against the live API) holds the services table with
//! the backends and the flow table with NEW and DROPPED events; a
//! screenshot is saved as `target/xvs-web-view.png`. Without the token
//! the API refuses, while the page itself (no data) loads.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;

use xvs_vm_tests::daemon::{bins, dir_of, Daemon};
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{backend_addr, Spec, Topology};
use xvs_vm_tests::wrk::Wrk;

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const CHROMIUM: &str = "/usr/bin/chromium";
const LISTEN: &str = "127.0.0.1:9880";

/// Where the screenshot goes: cargo's target directory.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
}

/// Headless Chromium in `t`'s gateway namespace on `url` with `args`
/// (bounded: `timeout` ends it after a minute); its standard output.
fn chromium(t: &Topology, profile: &std::path::Path, args: &[&str], url: &str) -> String {
    let out = t
        .gateway
        .command("timeout")
        .args(["--kill-after=5", "60", CHROMIUM])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_web_view_shows_services_and_flow_events_in_a_real_browser() {
    if !privileged("the_web_view_shows_services_and_flow_events_in_a_real_browser") {
        return;
    }
    if !std::path::Path::new(CHROMIUM).exists() {
        assert!(
            std::env::var_os("XVS_REQUIRE_PRIVILEGED").is_none(),
            "{CHROMIUM} is missing (make deps installs it)"
        );
        eprintln!("skipping: {CHROMIUM} not installed");
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _nginx = Nginx::on_backends(&t).unwrap();
    let dir = dir_of(&t, "web");
    std::fs::create_dir_all(&dir).unwrap();
    let token = "web-view-test-token-5c1e";
    let token_file = dir.join("token");
    std::fs::write(&token_file, token).unwrap();
    let backends: Vec<String> = (0..3)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let config = format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n\
         [admin]\nsocket = \"{}\"\ntcp = \"{LISTEN}\"\ntoken_file = \"{}\"\n\n\
         [[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n",
        t.gateway_client_if,
        dir.join("xvs.sock").display(),
        token_file.display(),
        backends.join(", ")
    );
    let (gw, _) = Daemon::start(&t, "web", &bins(TESTNET), &config, &[]).unwrap();

    // Traffic: new flows, and drops to a port no service serves.
    let w = Wrk::start(&t.client.ns, "http://198.19.0.1/", 2, true)
        .join()
        .unwrap();
    assert!(w.requests > 50, "{}", w.text);
    let _ = t
        .client
        .ns
        .exec("curl", &["-s", "-m", "1", "http://198.19.0.1:81/"]);

    // The page loads without the token; the API does not answer without it.
    let code = |path: &str| {
        let out = t
            .gateway
            .command("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("http://{LISTEN}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(code("/ui"), "200");
    assert_eq!(code("/ui/app.js"), "200");
    assert_eq!(code("/v1/services"), "401");
    assert_eq!(code("/v1/overview"), "401");

    // `xvs status` over the same listener, as from another host: with the
    // token it answers, with a wrong one it says why and exits 1.
    let status = |token_file: &std::path::Path| {
        t.gateway
            .command(&bins(TESTNET).join("xvs").display().to_string())
            .args(["status", "--json", "--server", LISTEN, "--token-file"])
            .arg(token_file)
            .output()
            .unwrap()
    };
    let out = status(&token_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["services"]["backends"], 3, "{json}");
    // The workers table says which pages the UMEM got, as status does.
    let pages = if json["workers"][0]["huge_pages"].as_bool().unwrap() {
        "copy, 2 MiB pages"
    } else {
        "copy, 4 KiB pages"
    };
    let wrong = dir.join("wrong-token");
    std::fs::write(&wrong, "not-the-token").unwrap();
    let out = status(&wrong);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bearer token"), "{err}");

    let profile = dir.join("chromium");
    let url = format!("http://{LISTEN}/ui#token={token}");
    let dom = chromium(
        &t,
        &profile,
        &["--virtual-time-budget=6000", "--dump-dom"],
        &url,
    );
    for wanted in [
        "TCP 198.19.0.1:80",
        &format!("{}:8080 (masq)", backend_addr(0)),
        &format!("{}:8080 (masq)", backend_addr(2)),
        "class=\"verdict-NEW\">NEW<",
        "class=\"verdict-DROPPED\">DROPPED<",
        ">no_service<",
        &format!("{} (client+backend): XDP", t.gateway_client_if),
        pages,
    ] {
        assert!(dom.contains(wanted), "{wanted:?} not in the page:\n{dom}");
    }
    assert!(!dom.contains("the admin API wants its token"), "{dom}");

    let shot = target_dir().join("xvs-web-view.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &t,
        &profile,
        &[
            "--virtual-time-budget=6000",
            "--window-size=1400,1100",
            &format!("--screenshot={}", shot.display()),
        ],
        &url,
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{}",
        png.len()
    );
    eprintln!("screenshot: {}", shot.display());
    let _ = std::fs::remove_dir_all(&profile);
    drop(gw);
}
