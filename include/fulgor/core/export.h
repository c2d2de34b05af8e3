#pragma once

// Note [Exported symbols]
// libfulgor is compiled with hidden visibility (CXX_VISIBILITY_PRESET hidden,
// VISIBILITY_INLINES_HIDDEN in CMakeLists.txt): only what is marked FULGOR_API
// is exported, as LibTorch marks its API with TORCH_API. Mark a public class
// whose members are defined in src/ (its vtable and typeinfo come with it, so
// that code outside may derive from it, dynamic_cast to it and catch it), and
// each public function defined there. fulgor::detail is never marked: what a
// template or macro of a public header must reach inside the library lives in
// fulgor::impl, marked, as c10's impl does, and so do the four functions the
// tests call (launches_ranks, device_setup, load_module_state,
// remove_stale_temporaries). The test exported_symbols lists libfulgor's
// dynamic symbols and fails on any of fulgor::detail.
//
// Code that uses fulgor sees the same attribute, which is the default there.
#if defined(__GNUC__) || defined(__clang__)
#define FULGOR_API __attribute__((visibility("default")))
#else
#define FULGOR_API
#endif
