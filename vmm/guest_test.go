package vmm

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// guestHeader is the bare-guest ABI as C, prepended to every test guest.
const guestHeader = `
typedef unsigned long u64; typedef unsigned int u32; typedef unsigned char u8;
static inline void outb(unsigned short p, u8 v) { __asm__ volatile("outb %0, %1" :: "a"(v), "Nd"(p)); }
static inline u64 outl(unsigned short p, u32 v) { u64 r; __asm__ volatile("outl %k1, %w2" : "=a"(r) : "a"((u64)v), "Nd"(p) : "memory"); return r; }
static void puts(const char *s) { while (*s) outb(0x500, *s++); }
static void report(u32 v) { outl(0x501, v); }
static u64 snapshot(void) { return outl(0x502, 0); }
static u64 fork(u32 n) { return outl(0x503, n); }
static void exit(u32 code) { outl(0x504, code); for (;;) ; }
void main(u64 memsize);
__asm__(".section .entry,\"ax\"\n.globl _start\n_start:\n call main\n mov $0x504, %dx\n xor %eax, %eax\n out %eax, %dx\n1: jmp 1b\n.text\n");
`

const guestLDS = `ENTRY(_start)
SECTIONS {
  . = 0x100000;
  .text : { *(.entry) *(.text*) }
  .rodata : { *(.rodata*) }
  .data : { *(.data*) }
  .bss : { *(.bss*) *(COMMON) }
  /DISCARD/ : { *(.note*) *(.comment) *(.eh_frame*) }
}
`

// buildGuest compiles a freestanding C bare guest with the machine's gcc
// and returns the flat program to load at BareEntry.
//
// With $TINE_VMM_GUESTS naming a directory, programs are kept there by
// the hash of their source and taken from there when present, so that
// the tests run on a machine without gcc (a nested L1) once a machine
// with gcc ran them (guests are built before the tests skip for want
// of /dev/kvm).
func buildGuest(t testing.TB, src string) []byte {
	t.Helper()
	cache := os.Getenv("TINE_VMM_GUESTS")
	cached := filepath.Join(cache, fmt.Sprintf("%x.bin", sha256.Sum256([]byte(guestHeader+src))))
	if cache != "" {
		if b, err := os.ReadFile(cached); err == nil {
			return b
		}
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is missing: it builds the bare test guests")
	}
	objcopy, err := exec.LookPath("objcopy")
	if err != nil {
		t.Skip("objcopy is missing: it builds the bare test guests")
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "guest.c")
	lds := filepath.Join(dir, "guest.lds")
	elf := filepath.Join(dir, "guest.elf")
	bin := filepath.Join(dir, "guest.bin")
	if err := os.WriteFile(c, []byte(guestHeader+src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lds, []byte(guestLDS), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gcc, "-O2", "-ffreestanding", "-nostdlib", "-static", "-fno-pie", "-no-pie",
		"-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-mno-red-zone", "-mgeneral-regs-only",
		"-T", lds, "-o", elf, c)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if out, err := exec.Command(objcopy, "-O", "binary", elf, bin).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if cache != "" {
		if err := os.WriteFile(cached, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return b
}
