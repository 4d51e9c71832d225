//! Build script of tmpi-transport: with the `ofi` feature, compiles the libfabric shim
//! (`src/ofi/shim.c`) and links libfabric. The default build compiles no C code.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_OFI").is_none() {
        return;
    }
    ofi::build();
}

#[cfg(feature = "ofi")]
mod ofi {
    /// Compiles the shim against libfabric's headers and links `libfabric`. `pkg-config
    /// libfabric` gives the include and library paths when it knows them (a libfabric built
    /// elsewhere); else the system's defaults are used (Debian's `libfabric-dev`).
    pub fn build() {
        println!("cargo:rerun-if-changed=src/ofi/shim.c");
        let mut b = cc::Build::new();
        b.file("src/ofi/shim.c").warnings(true).extra_warnings(true).flag_if_supported("-std=c11");
        let mut linked = false;
        if let Ok(out) = std::process::Command::new("pkg-config").args(["--cflags", "--libs", "libfabric"]).output() {
            if out.status.success() {
                for tok in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Some(p) = tok.strip_prefix("-I") {
                        b.include(p);
                    } else if let Some(p) = tok.strip_prefix("-L") {
                        println!("cargo:rustc-link-search=native={p}");
                    } else if tok == "-lfabric" {
                        linked = true;
                    }
                }
            }
        }
        b.compile("tmpi_ofi_shim");
        let _ = linked;
        println!("cargo:rustc-link-lib=dylib=fabric");
    }
}

#[cfg(not(feature = "ofi"))]
mod ofi {
    pub fn build() {}
}
