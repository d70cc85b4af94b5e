//! Man pages (clap_mangen) and shell completions (clap_complete) generated
//! from a binary's own command-line definition, for the Debian package
//! (`make deb`; docs/INSTALL.md). Each binary has a hidden way to ask for
//! them: `blipless-ingress --write-docs DIR`, `blipless-device --write-docs
//! DIR`, `blipless-ctl config docs DIR`.

use std::path::Path;

use clap_complete::Shell;

/// Writes `command`'s man pages into `<dir>/man1` (one per subcommand too,
/// `blipless-ctl-client.1` and so on) and its completions into
/// `<dir>/completions/{bash,zsh,fish}`.
pub fn write_docs(mut command: clap::Command, name: &str, dir: &Path) -> std::io::Result<()> {
    let man = dir.join("man1");
    std::fs::create_dir_all(&man)?;
    clap_mangen::generate_to(command.clone(), &man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let out = dir.join("completions").join(shell.to_string());
        std::fs::create_dir_all(&out)?;
        clap_complete::generate_to(shell, &mut command, name, &out)?;
    }
    Ok(())
}
