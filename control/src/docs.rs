//! The man pages and shell completions of `xvs` and `xvsadm`, made from
//! the definitions the programs parse with ([`crate::cli::command`],
//! [`crate::adm::cli::command`]) and from the config schema the validator
//! reads ([`xvs_config::schema`]): `xvs(8)`, `xvsadm(8)` and a page per
//! subcommand, `xvs.toml(5)`, and bash, zsh and fish completions.

use std::io;
use std::path::{Path, PathBuf};

use clap_complete::Shell;
use roff::{bold, italic, roman, Roff};
use xvs_config::schema::SECTIONS;

/// What was written, relative to the output folder.
pub fn write_all(out: &Path) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut put = |rel: String, bytes: Vec<u8>| -> io::Result<()> {
        let path = out.join(&rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, bytes)?;
        written.push(PathBuf::from(rel));
        Ok(())
    };
    for cmd in [crate::cli::command(), crate::adm::cli::command()] {
        for (name, page) in pages(&cmd)? {
            put(format!("man/man8/{name}.8"), page)?;
        }
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut c = cmd.clone();
            let name = c.get_name().to_owned();
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut c, &name, &mut text);
            let rel = match shell {
                Shell::Bash => format!("completions/bash/{name}"),
                Shell::Zsh => format!("completions/zsh/_{name}"),
                _ => format!("completions/fish/{name}.fish"),
            };
            put(rel, text)?;
        }
    }
    put("man/man5/xvs.toml.5".into(), config_page().into_bytes())?;
    Ok(written)
}

/// A command's page and one per visible subcommand (`xvs-run`, ...),
/// each as (name, roff).
fn pages(cmd: &clap::Command) -> io::Result<Vec<(String, Vec<u8>)>> {
    let name = cmd.get_name().to_owned();
    let cmd = cmd.clone().display_name(&name);
    let mut out = Vec::new();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("xvs")
        .render(&mut page)?;
    out.push((name.clone(), page));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let full = format!("{name}-{}", sub.get_name());
        let sub = sub.clone().name(full.clone()).display_name(&full);
        let mut page = Vec::new();
        clap_mangen::Man::new(sub)
            .section("8")
            .manual("xvs")
            .render(&mut page)?;
        out.push((full, page));
    }
    Ok(out)
}

/// `xvs.toml(5)`: every table and key the validator reads.
pub fn config_page() -> String {
    let mut r = Roff::new();
    r.control("TH", ["XVS.TOML", "5", "", "xvs", "File Formats"]);
    r.control("SH", ["NAME"]);
    r.text([roman("xvs.toml - the configuration file of xvs(8)")]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([bold(xvs_config::DEFAULT_CONFIG_PATH)]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman(
        "A TOML file read by xvs run at start and on SIGHUP (or xvsadm --reload). \
         xvs check-config validates it without running: every error is one line, \
         FILE:LINE:COLUMN: FIELD: MESSAGE. An invalid file changes nothing in a running xvs. \
         Unknown keys are refused everywhere, so a typo never becomes a default. \
         Durations are strings such as \"2s\" or \"500ms\".",
    )]);
    for s in SECTIONS {
        r.control("SH", [s.header.to_uppercase().as_str()]);
        r.text([roman(s.doc)]);
        for k in s.keys {
            r.control("TP", []);
            let mut head = vec![bold(k.name), roman(" ("), italic(k.kind)];
            if k.default.starts_with("required") {
                head.push(roman(format!("; {}", k.default)));
            } else if !k.default.is_empty() {
                head.push(roman(format!("; default {}", k.default)));
            }
            head.push(roman(")"));
            r.text(head);
            r.text([roman(k.doc)]);
        }
    }
    r.control("SH", ["EXAMPLE"]);
    r.control("nf", []);
    r.text([roman(EXAMPLE)]);
    r.control("fi", []);
    r.control("SH", ["SEE ALSO"]);
    r.text([roman("xvs(8), xvsadm(8), ipvsadm(8)")]);
    r.render()
}

/// A short two-arm example.
const EXAMPLE: &str = "[interfaces]
mode = \"two-arm\"
client = \"eth0\"
backend = \"eth1\"
queues = [0, 1]

[snat]
addresses = [\"198.18.1.1\"]

[[services]]
vip = \"198.19.0.1\"
port = 80
scheduler = \"mh\"

[[services.backends]]
address = \"198.18.2.10\"
port = 8080
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_page_names_every_key() {
        let page = config_page();
        for s in SECTIONS {
            for k in s.keys {
                assert!(page.contains(&format!("\\fB{}\\fR", k.name)), "{}", k.name);
            }
        }
    }

    #[test]
    fn the_example_of_the_config_page_is_valid() {
        let dir = std::env::temp_dir().join(format!("xvs-docs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("xvs.toml");
        std::fs::write(&file, EXAMPLE).unwrap();
        let loaded = xvs_config::load(&file);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(loaded.is_ok(), "{loaded:?}");
    }

    #[test]
    fn xvsadm_s_page_lists_every_option_of_the_parser() {
        let (_, page) = pages(&crate::adm::cli::command()).unwrap().remove(0);
        let page = String::from_utf8(page).unwrap();
        for o in crate::adm::ipvs_opts::options() {
            let long = format!("\\-\\-{}", o.long.replace('-', "\\-"));
            assert!(page.contains(&long), "{long}");
        }
        for sub in ["conntrack", "observe", "health"] {
            assert!(page.contains(&format!("xvsadm\\-{sub}")), "{sub}");
        }
    }
}
