"""Client-side encryption of S3 copies: the object format (`envelope`), streams over it
(`streams`), run keys and their key objects (`keyring`), recipients and identities (`recipients`)
and keyed content addresses (`names`)."""
