// Package proto holds the generated plugin protocol (pinned.proto).
// Regenerate with: go generate ./plugins/proto (needs protoc, protoc-gen-go
// and protoc-gen-go-grpc on PATH).
package proto

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative pinned.proto
