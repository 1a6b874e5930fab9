"""The resolved Plan of one image (its canonical JSON is the image identity), made from the
manifests, lock.yaml's versions and the recorded substitutions."""
