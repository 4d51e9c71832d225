//! `#[derive(Equivalence)]` for tmpi-rsmpi (the rsmpi-compatible `mpi` crate).
//!
//! The derived `Equivalence` describes a struct field by field (offsets from `offset_of!`,
//! tuples and arrays described structurally), builds the datatype once per type (on first use,
//! after `mpi::initialize`), and hands out a `'static` reference to it. Use
//! `#[mpi(crate = "path")]` when the `mpi` crate is known under another name.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Ts;
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Error, Fields, Type};

/// Derives `mpi::datatype::Equivalence` for a struct whose fields all have datatypes.
#[proc_macro_derive(Equivalence, attributes(mpi))]
pub fn derive_equivalence(input: TokenStream) -> TokenStream {
    let ast = parse_macro_input!(input as DeriveInput);
    match expand(&ast) {
        Ok(ts) => ts.into(),
        Err(e) => e.into_compile_error().into(),
    }
}

fn expand(ast: &DeriveInput) -> syn::Result<Ts> {
    let Data::Struct(s) = &ast.data else {
        return Err(Error::new_spanned(ast, "#[derive(Equivalence)] works on structs only"));
    };
    if !ast.generics.params.is_empty() {
        return Err(Error::new_spanned(&ast.generics, "#[derive(Equivalence)] does not support generic structs"));
    }
    let krate = crate_path(ast)?;
    let ident = &ast.ident;
    let name = ident.to_string();
    let (names, types): (Vec<Ts>, Vec<&Type>) = match &s.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| (quote!(#f.ident), &f.ty))
            .map(|(_, t)| t)
            .zip(f.named.iter())
            .map(|(t, f)| {
                let i = f.ident.as_ref().expect("named field");
                (quote!(#i), t)
            })
            .unzip(),
        Fields::Unnamed(f) => f
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let idx = syn::Index::from(i);
                (quote!(#idx), &f.ty)
            })
            .unzip(),
        Fields::Unit => (Vec::new(), Vec::new()),
    };
    let dts = types.iter().map(|t| datatype_of(&krate, t)).collect::<syn::Result<Vec<_>>>()?;
    let ones = types.iter().map(|_| quote!(1));
    Ok(quote! {
        // SAFETY: the datatype lists every field at its offset, described by the field's own
        // datatype; the extent rounds up to the largest alignment, which is the struct's size.
        unsafe impl #krate::datatype::Equivalence for #ident {
            type Out = #krate::datatype::DatatypeRef<'static>;
            fn equivalent_datatype() -> Self::Out {
                static DATATYPE: ::std::sync::OnceLock<#krate::datatype::UserDatatype> = ::std::sync::OnceLock::new();
                DATATYPE
                    .get_or_init(|| {
                        #krate::datatype::internal::check_derive_equivalence_universe_state(#name);
                        #krate::datatype::UserDatatype::structured::<#krate::datatype::UncommittedDatatypeRef<'_>>(
                            &[#(#ones as #krate::Count),*],
                            &[#(::core::mem::offset_of!(#ident, #names) as #krate::Address),*],
                            &[#(#krate::datatype::internal::uref(&#dts)),*],
                        )
                    })
                    .as_ref()
            }
        }
    })
}

/// An expression whose value is a datatype describing `ty`.
fn datatype_of(krate: &Ts, ty: &Type) -> syn::Result<Ts> {
    match ty {
        Type::Path(p) => Ok(quote!(<#p as #krate::datatype::Equivalence>::equivalent_datatype())),
        Type::Paren(p) => datatype_of(krate, &p.elem),
        Type::Group(g) => datatype_of(krate, &g.elem),
        Type::Tuple(t) => {
            let idx = (0..t.elems.len()).map(syn::Index::from);
            let ones = t.elems.iter().map(|_| quote!(1));
            let dts = t.elems.iter().map(|e| datatype_of(krate, e)).collect::<syn::Result<Vec<_>>>()?;
            Ok(quote! {
                #krate::datatype::UncommittedUserDatatype::structured::<#krate::datatype::UncommittedDatatypeRef<'_>>(
                    &[#(#ones as #krate::Count),*],
                    &[#(::core::mem::offset_of!(#t, #idx) as #krate::Address),*],
                    &[#(#krate::datatype::internal::uref(&#dts)),*],
                )
            })
        }
        Type::Array(a) => {
            let len = &a.len;
            let elem = datatype_of(krate, &a.elem)?;
            Ok(quote! {
                #krate::datatype::UncommittedUserDatatype::contiguous(
                    #krate::Count::try_from({ let len: usize = #len; len })
                        .expect("mpi derive: the array is too long for a Count (i32)"),
                    &#elem,
                )
            })
        }
        other => {
            Err(Error::new_spanned(other, "#[derive(Equivalence)]: this field type has no datatype (use a path, tuple or array type)"))
        }
    }
}

/// The path of the `mpi` crate: `::mpi`, or what `#[mpi(crate = "...")]` says.
fn crate_path(ast: &DeriveInput) -> syn::Result<Ts> {
    let mut path = None;
    for attr in ast.attrs.iter().filter(|a| a.path().is_ident("mpi")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let s: syn::LitStr = meta.value()?.parse()?;
                path = Some(s.parse::<syn::Path>()?);
                Ok(())
            } else {
                Err(meta.error("expected `crate = \"path\"`"))
            }
        })?;
    }
    Ok(match path {
        Some(p) => quote!(#p),
        None => quote!(::mpi),
    })
}
