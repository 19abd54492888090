// Hostile guest: writes to COM1 as fast as it can, forever, without looking at the line status.
#include "common.h"
        .text
        .globl _start
_start:
        movw $COM1, %dx
        movb $'A', %al
1:      outb %al, %dx
        jmp 1b
