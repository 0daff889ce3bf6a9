//! Every form `#[rate_limit]` accepts compiles, and runs where it has something to run:
//! each module of tests/forms/ is one form (its own imports, a renamed attribute, a
//! crate path through a re-export, fallbacks of each shape, settled rules, a body that
//! shadows the prologue's names). The errors are tests/ui.rs's.
#![allow(dead_code)]

#[path = "forms/crate_override.rs"]
mod crate_override;
#[path = "forms/fallback_shapes.rs"]
mod fallback_shapes;
#[path = "forms/forms.rs"]
mod forms;
#[path = "forms/renamed_import.rs"]
mod renamed_import;
#[path = "forms/settle.rs"]
mod settle;
#[path = "forms/shadowing_body.rs"]
mod shadowing_body;

#[test]
fn each_form_compiles_and_runs() {
    crate_override::main();
    fallback_shapes::main();
    forms::main();
    renamed_import::main();
    settle::main();
    shadowing_body::main();
}
