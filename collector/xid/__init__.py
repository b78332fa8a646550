"""Internal: the Xid catalog (what each NVIDIA Xid code means and how severe it is)."""
