//! Where a job's checkpoint state may lie relative to its output.
//!
//! Readers of the output take every name that does not start with a dot for
//! finished output (`docs/file-sink.md`), and Delta's `VACUUM` removes what
//! the table's log does not name unless it is hidden. So the state (its
//! lock, generation, finished marker and checkpoints) may sit inside the
//! output only under a hidden name, as the default `OUT/.state` does; the
//! two at one location, the state inside the output under a visible name,
//! or the output inside the state, are refused before anything is opened.
//!
//! Local paths are compared as the file system resolves them (symbolic
//! links, `.` and `..`, relative to the working directory), so two
//! spellings of one directory are one directory. Called by the demos when
//! they read their flags ([`check`]).

use std::path::{Component, Path, PathBuf};

use crate::location::Location;

/// Refuses a layout in which the state at `state` would be read, counted or
/// vacuumed as part of the output at `out`, or the output as part of the
/// state; the error names both locations and the fix. Called once a
/// program knows both locations, before it opens either.
pub fn check(out: &Location, state: &Location) -> anyhow::Result<()> {
    let (out_parts, state_parts) = match (out, state) {
        (Location::Local(out), Location::Local(state)) => {
            (components(&resolved(out)?), components(&resolved(state)?))
        }
        (Location::S3(out), Location::S3(state)) => (segments(out), segments(state)),
        // One local, one on an object store: apart.
        _ => return Ok(()),
    };
    if out_parts == state_parts {
        anyhow::bail!(
            "the output and the state are one location ({out}): the state's files would be \
             taken for output; keep the state apart, for example --state {}, the default",
            out.join(".state")
        );
    }
    if let Some(inside) = state_parts.strip_prefix(out_parts.as_slice()) {
        if !inside.iter().any(|name| name.starts_with('.')) {
            anyhow::bail!(
                "the state {state} is inside the output {out} under a name that readers take \
                 for output; give it a name starting with a dot (for example --state {}, the \
                 default) or put it outside {out}",
                out.join(".state")
            );
        }
    }
    if state_parts.len() < out_parts.len() && out_parts.starts_with(&state_parts) {
        anyhow::bail!(
            "the output {out} is inside the state {state}: the state holds checkpoints only; \
             put the output elsewhere, or leave --state out to keep the state in {}",
            out.join(".state")
        );
    }
    Ok(())
}

/// `path` as the file system resolves it, one name at a time from the
/// working directory or the root: an existing name with its symbolic links
/// followed, `..` the parent of what was resolved so far, a missing name
/// as written.
fn resolved(path: &Path) -> anyhow::Result<PathBuf> {
    let mut current = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        std::env::current_dir()
            .map_err(|error| anyhow::anyhow!("resolving {}: {error}", path.display()))?
    };
    for component in path.components() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                current.pop();
            }
            Component::Normal(name) => {
                let next = current.join(name);
                current = std::fs::canonicalize(&next).unwrap_or(next);
            }
        }
    }
    Ok(current)
}

/// A resolved path's names, root first.
fn components(path: &Path) -> Vec<String> {
    path.components()
        .map(|component| component.as_os_str().to_string_lossy().into_owned())
        .collect()
}

/// An `s3://bucket/prefix` URL's bucket and names; empty names (a doubled
/// `/`) are dropped, as the object store's paths drop them.
fn segments(url: &str) -> Vec<String> {
    url.trim_start_matches("s3://")
        .split('/')
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(path: &Path) -> Location {
        Location::Local(path.to_path_buf())
    }

    #[test]
    fn one_directory_spelled_two_ways_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        for state in [
            out.clone(),
            out.join("."),
            out.join("sub/.."),
            dir.path().join("./out/"),
        ] {
            let error = check(&local(&out), &local(&state)).unwrap_err().to_string();
            assert!(error.contains("one location"), "{error}");
            assert!(error.contains(".state"), "the fix is named: {error}");
        }
        // Through a symbolic link, and before the directory exists.
        std::os::unix::fs::symlink(&out, dir.path().join("link")).unwrap();
        assert!(check(&local(&out), &local(&dir.path().join("link"))).is_err());
        let missing = dir.path().join("missing");
        assert!(check(&local(&missing), &local(&missing.join("x/.."))).is_err());
    }

    #[test]
    fn a_state_inside_the_output_must_have_a_hidden_name() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        for visible in ["state", "a/state", ".././out/state"] {
            let error = check(&local(&out), &local(&out.join(visible)))
                .unwrap_err()
                .to_string();
            assert!(error.contains("starting with a dot"), "{visible}: {error}");
        }
        for hidden in [".state", ".x/state", "a/.state"] {
            check(&local(&out), &local(&out.join(hidden))).unwrap();
        }
    }

    #[test]
    fn an_output_inside_the_state_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let error = check(&local(&state.join("out")), &local(&state))
            .unwrap_err()
            .to_string();
        assert!(error.contains("inside the state"), "{error}");
    }

    #[test]
    fn separate_places_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        check(
            &local(&dir.path().join("out")),
            &local(&dir.path().join("state")),
        )
        .unwrap();
        check(
            &local(&dir.path().join("out")),
            &local(&dir.path().join("outer")),
        )
        .unwrap();
        check(
            &Location::S3("s3://b/out".into()),
            &local(&dir.path().join("out")),
        )
        .unwrap();
    }

    #[test]
    fn object_store_prefixes_follow_the_same_rules() {
        let s3 = |url: &str| Location::S3(url.into());
        assert!(check(&s3("s3://b/same"), &s3("s3://b/same")).is_err());
        assert!(check(&s3("s3://b/same"), &s3("s3://b//same")).is_err());
        assert!(check(&s3("s3://b/out"), &s3("s3://b/out/state")).is_err());
        assert!(check(&s3("s3://b/out/x"), &s3("s3://b/out")).is_err());
        check(&s3("s3://b/out"), &s3("s3://b/out/.state")).unwrap();
        check(&s3("s3://b/out"), &s3("s3://b/outer")).unwrap();
        check(&s3("s3://b/out"), &s3("s3://c/out")).unwrap();
    }
}
