package metadata

// Decodes is how many times r has read and decoded a file.
func Decodes(r *CachingReader) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.decodes
}
