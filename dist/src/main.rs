//! `msr-dist`: writes the man pages and the shell completions of the three
//! binaries, for the Debian packages (`scripts/package-test.sh`).
//!
//! Each page and each completion script is made from the binary's own clap
//! definition ([`msr_agent::cli::Cli`], [`msr_collector::daemon::cli::Cli`],
//! [`msr_collector::msrctl::Cli`]), so they cannot drift from `--help`.
//!
//! Output, under the directory given:
//!
//! * `man/msr-agent.8`, `man/msr-collector.8` (daemons: section 8),
//!   `man/msrctl.1` and one page per msrctl subcommand (`msrctl-site.1`,
//!   `msrctl-site-declare.1`, …);
//! * `completions/bash/NAME`, `completions/zsh/_NAME`,
//!   `completions/fish/NAME.fish`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{CommandFactory, Parser};
use clap_complete::Shell;

/// Writes the man pages and shell completions of msr-agent, msr-collector
/// and msrctl.
#[derive(Debug, Parser)]
#[command(name = "msr-dist", version)]
struct Cli {
    /// Directory to write `man/` and `completions/` into (created if
    /// missing).
    out_dir: PathBuf,
}

/// The manual every page belongs to (the centre of the page's footer).
const MANUAL: &str = "MSR selection";

/// One binary: its clap command, its man section and what its page adds to
/// clap's sections.
struct Binary {
    command: clap::Command,
    section: &'static str,
    files: &'static [(&'static str, &'static str)],
    see_also: &'static [&'static str],
}

fn binaries() -> [Binary; 3] {
    [
        Binary {
            command: msr_agent::cli::Cli::command(),
            section: "8",
            files: &[
                (
                    msr_agent::cli::DEFAULT_CONFIG,
                    "The media engine's XML config, read unchanged and watched for changes.",
                ),
                (
                    "/etc/default/msr-agent",
                    "MSR_AGENT_CONFIG and MSR_AGENT_OPTS for the systemd unit.",
                ),
                (
                    "/usr/lib/systemd/system/msr-agent.service",
                    "The systemd unit (user msr-agent).",
                ),
            ],
            see_also: &["msr-collector(8)", "msrctl(1)", "systemd.exec(5)"],
        },
        Binary {
            command: msr_collector::daemon::cli::Cli::command(),
            section: "8",
            files: &[
                (
                    msr_collector::config::DEFAULT_CONFIG_PATH,
                    "The collector's config (TOML; it holds the MSR accounts' passwords).",
                ),
                (
                    msr_collector::msrctl::DEFAULT_SOCKET,
                    "The control socket msrctl talks to (group msr-collector).",
                ),
                (
                    "/var/lib/msr-collector/",
                    "The operator store (sites, distances, coefficients).",
                ),
                (
                    "/usr/lib/systemd/system/msr-collector.service",
                    "The systemd unit (user msr-collector).",
                ),
            ],
            see_also: &["msrctl(1)", "msr-agent(8)"],
        },
        Binary {
            command: msr_collector::msrctl::Cli::command(),
            section: "1",
            files: &[(
                msr_collector::msrctl::DEFAULT_SOCKET,
                "The collector's control socket, unless --socket or MSRCTL_SOCKET names another.",
            )],
            see_also: &["msr-collector(8)", "msr-agent(8)"],
        },
    ]
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let man_dir = cli.out_dir.join("man");
    std::fs::create_dir_all(&man_dir)
        .with_context(|| format!("cannot create {}", man_dir.display()))?;
    let mut names = Vec::new();
    for binary in binaries() {
        let name = binary.command.get_name().to_owned();
        write_pages(&binary, &man_dir)?;
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            write_completion(binary.command.clone(), &name, shell, &cli.out_dir)?;
        }
        names.push(name);
    }
    // A packaging step that says what it made, as cargo-deb's does.
    println!(
        "msr-dist: man pages and bash, zsh and fish completions of {} written under {}",
        names.join(", "),
        cli.out_dir.display()
    );
    Ok(())
}

/// Writes the binary's page and, recursively, one page per visible
/// subcommand (`msrctl-site-declare.1`), as `clap_mangen::generate_to` does.
fn write_pages(binary: &Binary, dir: &Path) -> anyhow::Result<()> {
    let mut command = binary.command.clone().disable_help_subcommand(true);
    command.build();
    write_subcommand_pages(&command, binary.section, dir)?;
    let page = clap_mangen::Man::new(command)
        .section(binary.section)
        .manual(MANUAL);
    let path = dir.join(page.get_filename());
    let mut out = create(&path)?;
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    if binary.command.get_subcommands().next().is_some() {
        page.render_subcommands_section(&mut out)?;
    }
    if binary.command.get_after_help().is_some() {
        page.render_extra_section(&mut out)?;
    }
    writeln!(out, ".SH FILES")?;
    for (file, what) in binary.files {
        writeln!(out, ".TP\n.I {}\n{}", roff_text(file), roff_text(what))?;
    }
    writeln!(out, ".SH \"SEE ALSO\"")?;
    let see_also: Vec<String> = binary
        .see_also
        .iter()
        .map(|page| match page.split_once('(') {
            Some((name, section)) => format!(".BR {} ({}", roff_text(name), section),
            None => format!(".B {}", roff_text(page)),
        })
        .collect();
    writeln!(out, "{}", see_also.join(" ,\n"))?;
    page.render_version_section(&mut out)?;
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}

fn write_subcommand_pages(
    command: &clap::Command,
    section: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_subcommand_pages(sub, section, dir)?;
        let page = clap_mangen::Man::new(sub.clone())
            .section(section)
            .manual(MANUAL);
        let path = dir.join(page.get_filename());
        let mut out = create(&path)?;
        page.render(&mut out)?;
        out.flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn write_completion(
    mut command: clap::Command,
    name: &str,
    shell: Shell,
    out_dir: &Path,
) -> anyhow::Result<()> {
    let (dir, file) = match shell {
        Shell::Zsh => ("zsh", format!("_{name}")),
        Shell::Fish => ("fish", format!("{name}.fish")),
        _ => ("bash", name.to_owned()),
    };
    let dir = out_dir.join("completions").join(dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(file);
    let mut out = create(&path)?;
    clap_complete::generate(shell, &mut command, name, &mut out);
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}

fn create(path: &Path) -> anyhow::Result<BufWriter<File>> {
    File::create(path)
        .map(BufWriter::new)
        .with_context(|| format!("cannot create {}", path.display()))
}

/// Escapes text for a roff line: backslashes, and a leading `.` or `'`
/// that roff would read as a request.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}
