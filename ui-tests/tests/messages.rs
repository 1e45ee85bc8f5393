//! The form of every error the macros report (not rustc's own `error[E...]`
//! ones): one short line saying what is wrong, then a line starting `help:`
//! saying what to do, then where. Checked over the pinned `fail/*.stderr`.

/// Longer first lines are essays: say the rest in the `help:` line.
const MAX_FIRST_LINE: usize = 120;

#[test]
fn every_macro_error_is_one_short_line_and_a_help() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir("fail").expect("fail/ is readable") {
        let path = entry.expect("an entry of fail/").path();
        if path.extension().is_none_or(|e| e != "stderr") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable .stderr");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate().filter(|(_, l)| l.starts_with("error: ")) {
            checked += 1;
            let help = lines.get(i + 1).map(|l| l.trim_start());
            let at = lines.get(i + 2).map(|l| l.trim_start());
            if line.len() > MAX_FIRST_LINE
                || !help.is_some_and(|h| h.starts_with("help: "))
                || !at.is_some_and(|a| a.starts_with("--> "))
            {
                wrong.push(format!("{}:{}: {line}", path.display(), i + 1));
            }
        }
    }
    assert!(checked > 50, "only {checked} macro errors found in fail/*.stderr");
    assert!(wrong.is_empty(), "not one short line and a `help:` line:\n{}", wrong.join("\n"));
}
