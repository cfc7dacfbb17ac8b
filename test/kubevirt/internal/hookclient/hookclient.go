// Package hookclient talks to a hook sidecar over its unix socket with
// KubeVirt v1.9.0's own generated hooks clients (pkg/hooks/info and
// pkg/hooks/v1alpha3), keeping one connection open so repeated calls measure
// the sidecar rather than connection setup.
package hookclient

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	hooksInfo "kubevirt.io/kubevirt/pkg/hooks/info"
	hooksV1alpha3 "kubevirt.io/kubevirt/pkg/hooks/v1alpha3"
)

// Client is a connection to one sidecar socket.
type Client struct {
	socket    string
	conn      *grpc.ClientConn
	info      hooksInfo.InfoClient
	callbacks hooksV1alpha3.CallbacksClient
}

// Dial connects lazily to the sidecar listening on socket. Calls wait until
// the connection is ready (within their context), as KubeVirt's hook
// manager dials with grpc.WithBlock before each call: a sidecar's socket
// file appears at bind(2), a moment before listen(2) accepts connections.
func Dial(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		return nil, fmt.Errorf("dial hook socket %s: %w", socket, err)
	}
	return &Client{
		socket:    socket,
		conn:      conn,
		info:      hooksInfo.NewInfoClient(conn),
		callbacks: hooksV1alpha3.NewCallbacksClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Info calls kubevirt.hooks.info.Info/Info.
func (c *Client) Info(ctx context.Context) (*hooksInfo.InfoResult, error) {
	res, err := c.info.Info(ctx, &hooksInfo.InfoParams{})
	if err != nil {
		return nil, fmt.Errorf("Info on %s: %w", c.socket, err)
	}
	return res, nil
}

// OnDefineDomain calls kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain.
func (c *Client) OnDefineDomain(ctx context.Context, domainXML, vmiJSON []byte) ([]byte, error) {
	res, err := c.callbacks.OnDefineDomain(ctx, &hooksV1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
	if err != nil {
		return nil, fmt.Errorf("OnDefineDomain on %s: %w", c.socket, err)
	}
	return res.GetDomainXML(), nil
}

// Shutdown calls kubevirt.hooks.v1alpha3.Callbacks/Shutdown.
func (c *Client) Shutdown(ctx context.Context) error {
	if _, err := c.callbacks.Shutdown(ctx, &hooksV1alpha3.ShutdownParams{}); err != nil {
		return fmt.Errorf("Shutdown on %s: %w", c.socket, err)
	}
	return nil
}
