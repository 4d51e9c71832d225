//! Derive macros that describe a struct's layout field by field: `#[derive(Element)]` for
//! tmpi's own API (`tmpi::Element`, re-exported as `tmpi::Element`) and `#[derive(Equivalence)]`
//! for tmpi-rsmpi (the rsmpi-compatible `mpi` crate).
//!
//! Both walk the struct's fields the same way (offsets from `offset_of!`, tuples and arrays
//! described structurally) and build the layout once per type, on first use, with tmpi's
//! `TypeMapBuilder` (tmpi-rsmpi's datatypes are built the same way). Use
//! `#[mpi(crate = "path")]` / `#[tmpi(crate = "path")]` when the crate is known under another
//! name.

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
    let krate = crate_path(ast, "mpi", quote!(::mpi))?;
    let ident = &ast.ident;
    let name = ident.to_string();
    let (names, types) = fields(s);
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

/// The path of the crate: `default`, or what `#[<attr_name>(crate = "...")]` says.
fn crate_path(ast: &DeriveInput, attr_name: &str, default: Ts) -> syn::Result<Ts> {
    let mut path = None;
    for attr in ast.attrs.iter().filter(|a| a.path().is_ident(attr_name)) {
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
        None => default,
    })
}

/// The struct's fields: how to name each in `offset_of!`, and its type.
fn fields(s: &syn::DataStruct) -> (Vec<Ts>, Vec<&Type>) {
    match &s.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| {
                let i = f.ident.as_ref().expect("named field");
                (quote!(#i), &f.ty)
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
    }
}

/// Derives `tmpi::Element` for a struct whose fields are all `Element`: primitives, `bool`,
/// other derived structs, arrays and tuples of such, or `Pod` types marked `#[tmpi(pod)]`.
///
/// The type's map is built once, on first use; a struct without padding or `bool` is sent in
/// place. A field of any other type is a compile error, so a derived type is safe to send.
#[proc_macro_derive(Element, attributes(tmpi))]
pub fn derive_element(input: TokenStream) -> TokenStream {
    let ast = parse_macro_input!(input as DeriveInput);
    match expand_element(&ast) {
        Ok(ts) => ts.into(),
        Err(e) => e.into_compile_error().into(),
    }
}

fn expand_element(ast: &DeriveInput) -> syn::Result<Ts> {
    let Data::Struct(s) = &ast.data else {
        return Err(Error::new_spanned(ast, "#[derive(Element)] works on structs only"));
    };
    if !ast.generics.params.is_empty() {
        return Err(Error::new_spanned(&ast.generics, "#[derive(Element)] does not support generic structs"));
    }
    let krate = crate_path(ast, "tmpi", quote!(::tmpi))?;
    let ident = &ast.ident;
    let name = ident.to_string();
    let (names, types) = fields(s);
    let mut maps = Vec::new();
    for (f, ty) in s.fields.iter().zip(&types) {
        maps.push(if is_pod(f)? { quote!(#krate::TypeMap::pod::<#ty>()) } else { element_map(&krate, ty)? });
    }
    Ok(quote! {
        // SAFETY: every field is placed at its own offset with its own type's map (fields are
        // `Element` or `Pod`, or the impl does not compile), so the runs cover only bytes that
        // hold field data, and a value whose fields are valid is valid; the bounds are
        // `0..size_of::<Self>()` (checked when the map is built). A `Copy` struct of such
        // fields has no interior mutability.
        unsafe impl #krate::Element for #ident {
            fn type_map() -> &'static #krate::TypeMap {
                static MAP: ::std::sync::OnceLock<#krate::TypeMap> = ::std::sync::OnceLock::new();
                MAP.get_or_init(|| {
                    let mut b = #krate::TypeMapBuilder::new();
                    #( b.place(&#maps, ::core::mem::offset_of!(#ident, #names) as isize, 1); )*
                    #krate::typemap::internal::finish(b, ::core::mem::size_of::<#ident>(), #name)
                })
            }
        }
    })
}

/// Whether a field is marked `#[tmpi(pod)]`.
fn is_pod(f: &syn::Field) -> syn::Result<bool> {
    let mut pod = false;
    for attr in f.attrs.iter().filter(|a| a.path().is_ident("tmpi")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("pod") {
                pod = true;
                Ok(())
            } else {
                Err(meta.error("expected `pod`"))
            }
        })?;
    }
    Ok(pod)
}

/// An expression whose value is the `TypeMap` of `ty`.
fn element_map(krate: &Ts, ty: &Type) -> syn::Result<Ts> {
    match ty {
        Type::Path(p) => Ok(quote!(::core::clone::Clone::clone(<#p as #krate::Element>::type_map()))),
        Type::Paren(p) => element_map(krate, &p.elem),
        Type::Group(g) => element_map(krate, &g.elem),
        Type::Tuple(t) => {
            let idx = (0..t.elems.len()).map(syn::Index::from);
            let maps = t.elems.iter().map(|e| element_map(krate, e)).collect::<syn::Result<Vec<_>>>()?;
            Ok(quote! {{
                let mut b = #krate::TypeMapBuilder::new();
                #( b.place(&#maps, ::core::mem::offset_of!(#t, #idx) as isize, 1); )*
                #krate::typemap::internal::finish(b, ::core::mem::size_of::<#t>(), "a tuple")
            }})
        }
        Type::Array(a) => {
            let len = &a.len;
            let elem = element_map(krate, &a.elem)?;
            Ok(quote!(#krate::typemap::internal::array(&#elem, { let len: usize = #len; len })))
        }
        other => Err(Error::new_spanned(other, "#[derive(Element)]: this field type is not an Element (use a path, tuple or array type)")),
    }
}
