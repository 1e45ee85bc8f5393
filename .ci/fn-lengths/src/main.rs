//! Lists the functions of Rust sources, longest first: free functions,
//! methods of inherent and trait impls, trait methods with a default body,
//! and functions nested in other functions (functions that a `macro_rules!`
//! body writes are not seen).
//!
//! A function's length is its lines from the line of `fn` to its closing
//! brace, both counted: doc comments and attributes above it are not.
//!
//! Usage: fn-lengths PATH... [--over N] [--skip PATH]...
//! A PATH is a `.rs` file or a folder searched for them; `--over N` lists
//! only functions longer than N lines; `--skip` leaves a file or folder out.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use quote::ToTokens;
use syn::visit::{self, Visit};

struct Function {
    lines: usize,
    file: PathBuf,
    line: usize,
    name: String,
}

/// Walks one file, naming a method after the type (and trait) it belongs to.
struct Collector<'a> {
    file: &'a Path,
    owners: Vec<String>,
    found: Vec<Function>,
}

impl Collector<'_> {
    fn record(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let line = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let name = match self.owners.last() {
            Some(owner) => format!("{owner}::{}", sig.ident),
            None => sig.ident.to_string(),
        };
        self.found.push(Function { lines: end + 1 - line, file: self.file.to_path_buf(), line, name });
    }
}

fn tokens(t: &impl ToTokens) -> String {
    t.to_token_stream().to_string().replace(' ', "")
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig, block);
        }
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let owner = match &i.trait_ {
            Some((path, _)) => format!("<{} as {}>", tokens(&i.self_ty), tokens(path)),
            None => tokens(&i.self_ty),
        };
        self.owners.push(owner);
        visit::visit_item_impl(self, i);
        self.owners.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.owners.push(t.ident.to_string());
        visit::visit_item_trait(self, t);
        self.owners.pop();
    }
}

fn rust_files(path: &Path, skip: &[PathBuf], out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if skip.iter().any(|s| path.starts_with(s)) {
        return Ok(());
    }
    if path.is_dir() {
        let mut entries = std::fs::read_dir(path)?.map(|e| e.map(|e| e.path())).collect::<Result<Vec<_>, _>>()?;
        entries.sort();
        for entry in entries {
            rust_files(&entry, skip, out)?;
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
    Ok(())
}

fn main() -> ExitCode {
    let (mut paths, mut skip, mut over) = (Vec::new(), Vec::new(), 0);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--over" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => over = n,
                None => return usage("--over needs a number of lines"),
            },
            "--skip" => match args.next() {
                Some(p) => skip.push(PathBuf::from(p)),
                None => return usage("--skip needs a path"),
            },
            _ => paths.push(PathBuf::from(arg)),
        }
    }
    if paths.is_empty() {
        return usage("name a file or folder");
    }
    let mut files = Vec::new();
    for path in &paths {
        if let Err(e) = rust_files(path, &skip, &mut files) {
            eprintln!("fn-lengths: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    let mut found = Vec::new();
    for file in &files {
        let parsed = std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|text| syn::parse_file(&text).map_err(|e| format!("line {}: {e}", e.span().start().line)));
        match parsed {
            Ok(ast) => {
                let mut c = Collector { file, owners: Vec::new(), found: Vec::new() };
                c.visit_file(&ast);
                found.append(&mut c.found);
            }
            Err(e) => {
                eprintln!("fn-lengths: {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        }
    }
    found.retain(|f| f.lines > over);
    found.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| (&a.file, a.line).cmp(&(&b.file, b.line))));
    for f in &found {
        println!("{:4}  {}:{}  {}", f.lines, f.file.display(), f.line, f.name);
    }
    ExitCode::SUCCESS
}

fn usage(why: &str) -> ExitCode {
    eprintln!("fn-lengths: {why}\nusage: fn-lengths PATH... [--over N] [--skip PATH]...");
    ExitCode::from(2)
}
