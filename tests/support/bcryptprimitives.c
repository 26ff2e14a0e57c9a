/*
 * A stand-in for Windows' bcryptprimitives.dll, for running forewarn.exe
 * under Wine 8 in tests only (never shipped, never in the image).
 *
 * Rust's standard library (since 1.78) takes its random bytes from
 * ProcessPrng in bcryptprimitives.dll, which Windows 10 and later have and
 * Wine 8 does not: without this DLL beside the executable, Wine refuses to
 * load it. ProcessPrng fills `len` bytes at `data` with random bytes and
 * returns TRUE (as Windows' never fails); here they come from
 * SystemFunction036 (RtlGenRandom, advapi32), which Wine has.
 *
 * Built by tests/platforms.rs:
 *   x86_64-w64-mingw32-gcc -shared -O2 -o bcryptprimitives.dll bcryptprimitives.c -ladvapi32
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    /* RtlGenRandom takes a ULONG length: larger requests go in parts. */
    while (len > 0) {
        ULONG part = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, part))
            return FALSE;
        data += part;
        len -= part;
    }
    return TRUE;
}
