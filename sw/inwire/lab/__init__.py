"""`inwire lab`: a wide-area network emulated on one machine and the synchronization strategies measured
on it (docs/lab.md)."""
