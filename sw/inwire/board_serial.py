"""Sending bytes to a board's management port: a serial device (the Versa's USB UART) set to raw 8N1 with
the standard library's termios, so that no byte is translated, and written to until the last has left."""

import os
import stat
import termios

SPEEDS = {9600: termios.B9600, 115200: termios.B115200}


def send(path, data, baud):
    """Write `data` to the serial device `path` at `baud`, 8 data bits, no parity, one stop bit, no flow
    control; returns when the device has sent it. OSError naming `path` when there is no such device,
    ValueError when it is not a serial device."""
    if baud not in SPEEDS:
        raise ValueError(f"{baud} baud: not a rate this tool sets ({', '.join(map(str, SPEEDS))})")
    if not stat.S_ISCHR(os.stat(path).st_mode):
        raise ValueError(f"--device {path}: not a serial device (a character device such as /dev/ttyUSB1)")
    # Without O_NONBLOCK the open waits for a carrier that a USB UART never raises; no controlling terminal.
    device = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        if not os.isatty(device):
            raise ValueError(f"--device {path}: not a serial device (not a terminal)")
        attributes = termios.tcgetattr(device)
        attributes[0] = 0  # iflag: no input translation, no software flow control
        attributes[1] = 0  # oflag: no output processing (a 0x0a byte stays one byte)
        attributes[2] = termios.CS8 | termios.CREAD | termios.CLOCAL  # 8N1, modem lines ignored, no RTS/CTS
        attributes[3] = 0  # lflag: no echo, no line editing, no signals
        attributes[4] = attributes[5] = SPEEDS[baud]
        termios.tcsetattr(device, termios.TCSANOW, attributes)
        os.set_blocking(device, True)
        view = memoryview(data)
        while view:
            view = view[os.write(device, view):]
        termios.tcdrain(device)
    finally:
        os.close(device)
