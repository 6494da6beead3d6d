// fmt's out-of-line definitions, compiled into a program that links them in instead of loading
// libfmt.so (common/meson.build says which and why). They come from the installed fmt's own
// format-inl.h, so they match the headers every other object was compiled against.
// g++ 13 (the GPU hosts') reports a false -Warray-bounds and -Wstringop-overflow inside fmt's
// bigint (format_dragon), code that libfmt itself is compiled from; the file holds only fmt's code,
// so both are off for all of it (a middle-end warning is placed after inlining, outside a
// push/pop around the include).
#if defined(__GNUC__) && !defined(__clang__)  // clang has no -Wstringop-overflow
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
// format.h declares these two templates without a body for char; libfmt instantiates them.
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl<char>(locale_ref) -> char;
}  // namespace detail
FMT_END_NAMESPACE
