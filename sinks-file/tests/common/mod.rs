//! Helpers shared by the file sink's tests: what a reader of the output sees.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The finished files a reader of the output sees.
pub fn visible_files(dir: &Path) -> Vec<PathBuf> {
    sinks_file::finished_files(dir).expect("the output can be read")
}

/// The numbers in the finished files, one per line, sorted.
pub fn visible_numbers(dir: &Path) -> Vec<u64> {
    let mut numbers: Vec<u64> = visible_files(dir)
        .iter()
        .flat_map(|file| {
            std::fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .map(|line| line.parse::<u64>().unwrap_or(u64::MAX))
                .collect::<Vec<_>>()
        })
        .collect();
    numbers.sort_unstable();
    numbers
}

/// What is wrong with `numbers` as "0..count, each once", if anything.
pub fn exactly_once_problem(numbers: &[u64], count: u64) -> Option<String> {
    let duplicates: Vec<u64> = numbers
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if !duplicates.is_empty() {
        return Some(format!(
            "duplicated: {:?}",
            &duplicates[..duplicates.len().min(20)]
        ));
    }
    if numbers.len() as u64 != count || numbers.last().is_some_and(|&n| n + 1 != count) {
        let missing: Vec<u64> = (0..count)
            .filter(|n| numbers.binary_search(n).is_err())
            .take(20)
            .collect();
        return Some(format!(
            "{} records instead of {count}; missing {missing:?}",
            numbers.len()
        ));
    }
    None
}
