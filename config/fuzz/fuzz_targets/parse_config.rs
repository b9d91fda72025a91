//! Fuzzes the config parser and validator: any input must yield a config or
//! located diagnostics, never a panic; every diagnostic must point inside the
//! input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(invalid) = xvs_config::parse_str("fuzz.toml", text) {
        assert!(!invalid.diagnostics.is_empty());
        let lines = text.split('\n').count();
        for d in &invalid.diagnostics {
            assert!(d.line >= 1 && d.line <= lines, "{d}");
            assert!(d.column >= 1, "{d}");
        }
    }
});
